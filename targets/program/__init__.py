"""Running a bundle's own program in Python, with real delegate executors.

    walker.py         the execution-plan walker: kernel calls on torch's reference ops,
                      delegate calls handed to a DelegateRunner
    tosa_delegate.py  TOSABackend payloads on the TOSA reference model (tosa-tools)
    mlx_delegate.py   MLXBackend payloads on the mlx package (mlx_graph.py, mlx_ops.py)
    (targets/workers/program.py is the child process tosa:// and mlx:// run this in)
"""
