"""ExecuTorch's Arm runner (arm_executor_runner), whatever carries its bytes.

    simulator.py  one supervised simulator process (FVP, QEMU)
    fvp.py, qemu.py, serial.py   the lanes: they only move bytes (serial_*.py: the serial lane's parts)
    perf.py       the runner's PMU and memory figures from its log
    qemu_plugin.py   QEMU's instruction count (a TCG plugin built by firmware_scripts/arm)
    intermediates.py   `debug` on the Arm lanes (one case with every intermediate, ETDump)

The runner's log parser, session protocol and output decoding are shared with the lanes that run
ExecuTorch's portable executor_runner, so they live in targets/et_runner/.
"""
