"""ExecuTorch's Arm runner (arm_executor_runner), whatever carries its bytes.

    log.py        the runner-log parser (ET_LOG lines, BundleIO markers, printed outputs, ETDump block)
    outputs.py    outputs from ETDump (bit exact) or printed lines (lossy)
    protocol.py   how a session ended, the failure it shows (targets.failures), the device's own
                  verdict, and output collection: one protocol for every Arm-runner lane
    simulator.py  one supervised simulator process (FVP, QEMU)
    fvp.py, qemu.py, serial.py   the lanes: they only move bytes (serial_*.py: the serial lane's parts)
"""
