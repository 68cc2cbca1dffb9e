"""Runtime workers: the child processes that load a bundle into a runtime and run its cases.

`host` (the ExecuTorch pybindings), `program` (tosa:// and mlx://: the program walked in Python)
and `debug` (one case with every intermediate, for `bundlerun debug`) are the children;
`supervisor` starts, watches and reaps them (a crash or hang costs one case, never bundlerun);
`protocol` is the JSON-lines codec and event driver they share with `bundlerun worker` over SSH.
"""
