"""Detaching many uprobes without making the agent wait for the kernel."""

from __future__ import annotations

import os

from memtrace.bpf.libbpf import Link, destroy_together

# Benchmarks that attach and detach in a loop turn this off: they must not
# measure the next round with the last round's probes still going away.
DETACH_IN_BACKGROUND = True


def destroy_links(links: list[Link]) -> None:
    """Detach many uprobes without making the caller wait for the kernel.

    Removing a uprobe waits out the kernel's tracepoint grace periods, one
    probe at a time, serialised by the kernel (a hundred took seconds:
    docs/design/evidence.md#link-removal). So a detached grandchild holds a
    reference to every probe while this process drops its own (each at
    once), then exits and leaves the slow part to the kernel, in the
    background: the uprobes go away within seconds of the agent, and until
    then they only feed a ring nobody reads. (Never used for the mmap
    tracepoint: it could hold a process nobody continues.)"""
    if len(links) < 8 or not DETACH_IN_BACKGROUND:
        # A few links (multi-uprobe ones: every probe of a library in one) go
        # here and now, so that no breakpoint outlives the run, together.
        destroy_together(links)
        return
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            if os.fork() == 0:
                os.close(w)
                _keep_only_bpf_fds(r)
                os.read(r, 1)  # until the agent has dropped its references
        finally:
            os._exit(0)
    os.close(r)
    os.waitpid(pid, 0)
    try:
        for link in links:
            link.destroy()  # the grandchild's reference keeps the removal off this path
    finally:
        os.close(w)


def _keep_only_bpf_fds(keep: int) -> None:  # pragma: no cover - runs in the detaching grandchild
    """Close every inherited file but `keep` and the kernel objects (links,
    perf events, maps, programs: anonymous inodes). The grandchild lives
    for seconds while the kernel removes the probes; an inherited pipe
    (the guardian's, a shell pipeline's stdout) would keep its reader
    waiting that long: `push` took 5 s to exit on SIGINT."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd == keep:
            continue
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("anon_inode:"):
                continue
            os.close(fd)
        except OSError:
            pass  # the listing's own descriptor, gone already
