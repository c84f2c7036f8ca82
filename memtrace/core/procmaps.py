"""Names in /proc/PID/maps and /proc/PID/map_files (pure: no I/O)."""

from __future__ import annotations


def map_files_path(pid: int, address_range: str) -> str:
    """/proc/PID/map_files/ entry of a maps line's range.

    maps pads addresses to 8 hex digits ("0041f000-006d2000", as a non-PIE
    executable such as Debian's and Ubuntu's /usr/bin/python3.x is mapped);
    map_files names the same mapping without the padding ("41f000-6d2000").
    """
    lo, hi = address_range.split("-")
    return f"/proc/{pid}/map_files/{int(lo, 16):x}-{int(hi, 16):x}"
