"""What any remote device needs, whatever carries the bytes.

    transport.py     the Transport interface: shell with a reliable exit status (an appended
                     marker, since legacy shells carry none), push, pull, list, stat; and the
                     transport fault kinds (offline, unauthorized, no space, ...)
    device_cache.py  the content-addressed device cache: every file pushed once, keyed by
                     sha256, verified before reuse, renamed into place only when complete

Android's adb (the adb server through the real `adb` CLI, or the device protocol directly
through adb-shell) implements Transport in targets/android/; an SSH transport is the next.
"""
