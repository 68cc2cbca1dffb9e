"""What every ExecuTorch runner binary prints, and how a session with one ends.

Shared by every lane that runs a runner binary rather than the pybindings: Arm's
`arm_executor_runner` (FVP, QEMU mps3-an547, a board's UART), the portable `executor_runner`
(Android over ADB, qemu-user, Vulkan on lavapipe, MLX's C++ delegate) and the numerics that read
printed outputs. `log` parses the log lines, `protocol` classifies how a session ended,
`outputs` decodes output tensors (ETDump or printed), `executor_runner` is the portable runner's
own contract (flags, files, exit codes).
"""
