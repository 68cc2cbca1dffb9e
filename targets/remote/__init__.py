"""What any remote device needs, whatever carries the bytes.

    transport.py     the Transport interface: shell with a reliable exit status (an appended
                     marker, since legacy shells carry none), push, pull, list, stat; and the
                     transport fault kinds (offline, unauthorized, no space, ...)
    device_cache.py  the content-addressed device cache: every file pushed once, keyed by
                     sha256, verified before reuse, renamed into place only when complete
    ssh_transport.py the system OpenSSH client as a Transport (one ControlMaster connection)

Android's adb (the adb server through the real `adb` CLI, or the device protocol directly
through adb-shell) implements Transport in targets/android/; SSH (targets/ssh.py, `ssh://`)
uses ssh_transport.py here.
"""
