"""`bundlerun farm PLAN.toml`: many bundles x many targets on existing engines.

- plan.py      the plan file (strict: an unknown key is an error with a did-you-mean) and its
               expansion into jobs (bundle x target group; a device pool is one group whose
               jobs run on any one of its devices)
- devices.py   which physical device a target URL occupies (`adb:SERIAL`, `board:NAME`), or
               none (simulators and the host run as CPU work)
- worker.py    one job attempt, in whatever process the executor gives it (a pool worker or a
               Ray task): the Session API, no history (the coordinator records one per job)
- executors.py `local` (a process pool on this machine) and `ray[://ADDRESS]` (each device a
               Ray custom resource, held by the device's actor so it runs one job at a time
               wherever its host is; jobs without a device are Ray tasks)
- ray_workers.py the devices' detached Ray actors, kept between commands, keyed by a hash of
               the code (`--release-workers` ends them)
- results.py   reports and history records written as jobs finish, in a thread, in batches
- scheduler.py the coordinator: device exclusivity, per-target concurrency, retries of
               infrastructure errors on the same or another device, never of numerical failures
- run.py       the whole farm: builds, scheduling, the merged report (runner/report/merge.py, jobs
               mode), one history record per job, flaky marks, `--shard i/n` of the jobs

Only the standard library is imported here: the CLI imports this package lazily, Ray only
when `--executor ray` is asked for.
"""
