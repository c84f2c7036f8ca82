"""A process's TCP connections as the kernel's tcp_info has them, at one instant.

Pure data: the TCP source (memtrace.sources.tcp) fills these from sock_diag;
the diagnosis reads them. A connection's smoothed round trip against the
least the kernel saw on it (its windowed minimum, tcp_min_rtt_wlen: five
minutes by default) and against what it was while the process was healthy
tells a queue on its path (or a slow peer) from a slow process at this end.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TcpPath:
    """One established TCP connection of a process."""

    local: str  # address:port ([v6]:port)
    peer: str
    srtt_us: int  # the smoothed round trip (tcpi_rtt)
    min_rtt_us: int  # the least round trip seen (tcpi_min_rtt); 0: none measured yet
    last_send_ms: int  # since it last sent data (tcpi_last_data_sent)
    last_recv_ms: int  # since it last received data (tcpi_last_data_recv)
    bytes_acked: int
    bytes_received: int
    retransmits: int  # segments retransmitted over its life (tcpi_total_retrans)
    inode: int

    def queued(self, typical_us: float, highest_us: float, within_ms: int, ratio: float, over_us: int) -> bool:
        """Its round trip stands at `ratio` times what it typically was while the process was
        healthy (at least its least) and `over_us` above the highest it was then, with data
        exchanged in the last `within_ms`: replies wait in a queue on the path (a full link at
        the far side) or at a slow peer. A connection's round trip includes the queue its own
        bursts make at its own link, which is why its least alone is no baseline, and why a
        round trip its healthy readings reached is not one. An idle connection's is its last."""
        typical, highest = max(typical_us, self.min_rtt_us), max(highest_us, self.min_rtt_us)
        return (
            typical > 0
            and min(self.last_send_ms, self.last_recv_ms) <= within_ms
            and self.srtt_us >= ratio * typical
            and self.srtt_us - highest >= over_us
        )
