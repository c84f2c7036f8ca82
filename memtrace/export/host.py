"""The summary's `host` and `collectives` sections (export/schema.py), from
the host signals' book (model/host.py): the readings become rows here,
and nowhere else."""

from __future__ import annotations

from collections.abc import Mapping

from typing_extensions import TypedDict

from memtrace.core.cpu import CpuStats
from memtrace.core.gpu import GpuSample
from memtrace.core.ids import ProcessKey
from memtrace.core.nccl import Collective
from memtrace.core.netdev import QdiscSample
from memtrace.export import schema
from memtrace.model.host import ByteCounter, GpuSeries, HostBook, MigSeries, NvLinkSeries, SensorState, Series

TOP_PREEMPTORS = 5
IDLE_PREEMPTOR = "(idle: own CPU quota)"  # a preemptor cgroup of 0: the CPU idled under the process's quota


def wall_start_ns(key: ProcessKey, boot_wall_ns: int) -> int:
    """A process's start as the rows say it: wall-clock ns (0: unknown)."""
    return boot_wall_ns + key.start_ns if key.start_ns else 0


def sensor_state(s: SensorState) -> schema.SensorState:
    if s.on:
        return schema.SensorState(state="on")
    return schema.SensorState(state="off", reason=s.reason, fix=s.fix)


def host_section(
    book: HostBook,
    *,
    boot_wall_ns: int,
    cgroup_names: Mapping[int, str],
    pids: set[int] | None,
    sample_interval_seconds: float,
    sample_errors: int,
    fast_sampler: schema.FastSampler,
    agent_pid: int | None = None,
) -> schema.Host:
    """The summary's `host`: `cgroup_names` names the cgroup ids the rows
    carry; `pids`: the traced pids (a GPU's processes are listed among
    them; None: all); `agent_pid`: memtrace's own, so a preemptor that is
    memtrace is said to be."""
    cpu_on = "cpu" in book.sensors and book.sensors["cpu"].on
    return schema.Host(
        sensors={k: sensor_state(v) for k, v in sorted(book.sensors.items())},
        cpu=cpu_rows(book, cgroup_names, boot_wall_ns, agent_pid),
        gpus=[gpu_row(g, pids) for g in sorted(book.gpus.values(), key=lambda g: g.index)],
        nvidia_driver=book.driver_version,
        network=network(book),
        processes_dropped=book.processes_dropped,
        cpu_sensor=cpu_sensor_gaps(book.cpu_gaps) if cpu_on else None,
        sample_interval_seconds=sample_interval_seconds,
        sample_errors=sample_errors,
        fast_sampler=fast_sampler,
    )


def cpu_sensor_gaps(gaps: Mapping[str, int]) -> schema.CpuSensorGaps:
    return schema.CpuSensorGaps(
        switch_gaps=gaps.get("switch_gaps", 0),
        processes_not_kept=gaps.get("processes_not_kept", 0),
        threads_not_kept=gaps.get("threads_not_kept", 0),
        preemptions_not_attributed=gaps.get("preemptions_not_attributed", 0),
    )


def _latency(hist: tuple[int, ...], st: CpuStats, runq: bool) -> schema.Latency | None:
    n = sum(hist)
    q = st.runq_quantile_us if runq else st.offcpu_quantile_us
    p50, p99 = q(0.5), q(0.99)
    if not n or p50 is None or p99 is None:
        return None
    return schema.Latency(count=n, p50=p50, p99=p99)


def cpu_rows(
    book: HostBook, cgroup_names: Mapping[int, str], boot_wall_ns: int, agent_pid: int | None = None
) -> list[schema.CpuRow]:
    """One row per process the CPU sensor measured, in the order last read;
    `agent_pid`: memtrace's own pid (its preemptions are marked)."""
    rows = []
    for key, st in book.cpu.items():
        alive = st.oncpu_ns + st.offcpu_ns + st.runq_ns
        q = book.quota_throttled_ns.get(key)
        rows.append(
            schema.CpuRow(
                pid=key.pid,
                start_time_unix_nano=wall_start_ns(key, boot_wall_ns),
                process=book.names.get(key, ""),
                on_cpu_seconds=st.oncpu_ns / 1e9,
                off_cpu_seconds=st.offcpu_ns / 1e9,
                run_queue_seconds=st.runq_ns / 1e9,
                stolen_seconds=st.stolen_ns / 1e9,
                run_queue_share=st.runq_ns / alive if alive else 0.0,
                run_queue_latency_us=_latency(st.runq_hist, st, runq=True),
                off_cpu_us=_latency(st.offcpu_hist, st, runq=False),
                voluntary_switches=st.voluntary,
                involuntary_switches=st.involuntary,
                cgroup_id=st.cgroup_id,
                cgroup=cgroup_names.get(st.cgroup_id),
                cpu_quota=None
                if q is None
                else schema.CpuQuota(cgroup=q[0], throttled_seconds=q[1] / 1e9, throttled_periods=q[2]),
                preempted_by=[
                    schema.Preemptor(
                        cgroup_id=p.cgroup_id,
                        cgroup=IDLE_PREEMPTOR if p.cgroup_id == 0 else cgroup_names.get(p.cgroup_id),
                        switches=p.count,
                        run_queue_seconds=p.wait_ns / 1e9,
                        pid=p.pid,
                        process=p.comm,
                        memtrace=agent_pid is not None and p.pid == agent_pid,
                    )
                    for p in st.preemptors[:TOP_PREEMPTORS]
                ],
                netns=None if (now := book.identity_of(key)) is None else now.netns,
                placements=placement_rows(book, key),
                placements_dropped=book.placements_dropped.get(key, 0),
            )
        )
    return rows


def placement_rows(book: HostBook, key: ProcessKey) -> list[schema.Placement]:
    """The process's spans, each with what its cgroups counted during it: the
    next span's counters at its start (or the totals now) less its own."""
    spans = book.placements.get(key, [])
    if not spans:  # never placed (a row made from readings alone)
        return []
    q = book.quota_throttled_ns.get(key)
    ends: list[tuple[int | None, tuple[int, int], int | None]] = [
        (s.since_ns, s.throttled, s.limit_hits) for s in spans[1:]
    ]
    ends.append((None, (q[1], q[2]) if q else (0, 0), book.memory_limit_hits.get(key)))
    rows = []
    for span, (until, throttled, hits) in zip(spans, ends, strict=True):
        i = span.identity
        rows.append(
            schema.Placement(
                from_time_unix_nano=span.since_ns,
                to_time_unix_nano=until,
                netns=i.netns,
                cgroup=i.cgroup,
                cgroup_id=i.cgroup_id,
                process=i.comm,
                executable=i.exe,
                cpu_quota_throttled_seconds=max(throttled[0] - span.throttled[0], 0) / 1e9,
                memory_limit_hits=None if hits is None or span.limit_hits is None else max(hits - span.limit_hits, 0),
            )
        )
    return rows


def _mean_max(s: Series | ByteCounter, scale: float = 1.0) -> schema.MeanMax | None:
    mm = s.mean_max()
    return None if mm is None else schema.MeanMax(mean=mm[0] * scale, max=mm[1] * scale)


def gpu_row(g: GpuSeries, pids: set[int] | None) -> schema.GpuRow:
    last = g.last
    link = None
    if last is not None and last.max_link_width is not None:
        link = schema.PcieLink(
            generation=last.link_generation,
            width=last.link_width,
            max_generation=last.max_link_generation,
            max_width=last.max_link_width,
            lowest_seen=None
            if g.narrowest is None
            else schema.LinkWidth(generation=g.narrowest[0], width=g.narrowest[1]),
            degraded_share=g.degraded_samples / g.link_samples if g.link_samples else None,
        )
    # PCIe throughput: exact from the driver's byte counters, or NVML's 20 ms estimates.
    if g.pcie_counted:
        tx, rx = g.pcie_tx_count, g.pcie_rx_count
        source: str | None = "byte_counters"
        tx_rate, rx_rate = _mean_max(tx), _mean_max(rx)
        tx_bytes, rx_bytes = tx.bytes if tx.seconds else None, rx.bytes if rx.seconds else None
        resets = tx.resets + rx.resets
    else:
        source = "20ms_samples" if g.pcie_tx.n or g.pcie_rx.n else None
        tx_rate, rx_rate = _mean_max(g.pcie_tx), _mean_max(g.pcie_rx)
        tx_bytes = rx_bytes = None
        resets = 0
    return schema.GpuRow(
        index=g.index,
        uuid=g.uuid,
        name=g.name,
        bus_id=g.bus_id,
        samples=g.samples,
        lost_samples=g.lost_samples,
        sm_utilization_percent=_mean_max(g.sm),
        memory_utilization_percent=_mean_max(g.mem_util),
        sm_clock_mhz=_mean_max(g.sm_clock),
        memory_clock_mhz=_mean_max(g.memory_clock),
        memory_used_bytes=_mean_max(g.memory_used),
        memory_total_bytes=None if last is None else last.memory_total_bytes,
        temperature_celsius=_mean_max(g.temperature),
        power_watts=_mean_max(g.power, 1e-3),
        pcie_throughput_from=source,
        pcie_tx_bytes_per_second=tx_rate,
        pcie_rx_bytes_per_second=rx_rate,
        pcie_tx_bytes=tx_bytes,
        pcie_rx_bytes=rx_bytes,
        pcie_counter_resets=resets,
        pcie_link=link,
        pcie_replays=g.delta("pcie_replay_count"),
        ecc_corrected_errors=g.delta("ecc_corrected_volatile"),
        ecc_uncorrected_errors=g.delta("ecc_uncorrected_volatile"),
        clock_event_reasons=sorted(g.reasons),
        throttled_share=g.throttled_samples / g.clock_samples if g.clock_samples else None,
        xids=list(g.xids),
        processes=[
            schema.GpuProcess(
                pid=pid,
                used_memory_bytes=used,
                mig_uuid=g.mig.get(pid),
                sm_percent=_mean_max(g.process_sm[pid]) if pid in g.process_sm else None,
            )
            for pid, used in sorted(g.processes.items())
            if pids is None or pid in pids
        ],
        gpm=g.gpm_supported,
        activity=_activity(g, g.gpm_supported),
        nvlinks=[_nvlink_row(link) for _, link in sorted(g.nvlinks.items())],
        remapped_rows=_remapped(last),
        mig_enabled=None if last is None else last.mig_enabled,
        mig_instances=[
            schema.MigInstanceRow(
                slot=m.slot,
                uuid=m.uuid,
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
                memory_used_bytes=m.memory_used_bytes,
                memory_total_bytes=m.memory_total_bytes,
                pids=sorted(p.pid for p in m.processes),
                **_mig_over_run(g, g.mig_instances.get(m.uuid), pids),
            )
            for m in (() if last is None else last.mig_instances)
        ],
    )


class _MigOverRun(TypedDict):
    memory_used_over_run: schema.MeanMax | None
    processes: list[schema.GpuProcess]
    activity: schema.GpuActivity | None


def _mig_over_run(g: GpuSeries, m: MigSeries | None, pids: set[int] | None) -> _MigOverRun:
    """A MIG instance's rows over the run, as a device of its own (the GPU's GPM says whether it has any)."""
    if m is None:
        return _MigOverRun(memory_used_over_run=None, processes=[], activity=None)
    return _MigOverRun(
        memory_used_over_run=_mean_max(m.memory_used),
        processes=[
            schema.GpuProcess(
                pid=pid,
                used_memory_bytes=used,
                mig_uuid=m.uuid,
                sm_percent=_mean_max(g.process_sm[pid]) if pid in g.process_sm else None,
            )
            for pid, used in sorted(m.processes.items())
            if pids is None or pid in pids
        ],
        activity=_activity(m, g.gpm_supported),
    )


def _activity(g: GpuSeries | MigSeries, gpm: bool | None) -> schema.GpuActivity | None:
    """A GPU's or MIG instance's GPM activity; None where its GPU has no GPM (`gpm`)."""
    if not gpm:
        return None
    return schema.GpuActivity(
        sm_active_percent=_mean_max(g.sm_active),
        sm_occupancy_percent=_mean_max(g.sm_occupancy),
        tensor_active_percent=_mean_max(g.tensor_active),
        dram_bandwidth_percent=_mean_max(g.dram_bandwidth),
    )


def _nvlink_row(link: NvLinkSeries) -> schema.NvLinkRow:
    return schema.NvLinkRow(
        link=link.link,
        active=link.active,
        down_share=link.down_samples / link.samples if link.samples else None,
        tx_bytes=link.tx.bytes if link.tx.seconds else None,
        rx_bytes=link.rx.bytes if link.rx.seconds else None,
        tx_bytes_per_second=_mean_max(link.tx),
        rx_bytes_per_second=_mean_max(link.rx),
        crc_errors=link.errors.get("crc_errors"),
        replay_errors=link.errors.get("replay_errors"),
        recovery_errors=link.errors.get("recovery_errors"),
        counter_resets=link.tx.resets + link.rx.resets,
    )


def _remapped(last: GpuSample | None) -> schema.RemappedRowsRow | None:
    r = None if last is None else last.remapped_rows
    if r is None:
        return None
    return schema.RemappedRowsRow(
        correctable=r.correctable, uncorrectable=r.uncorrectable, pending=r.pending, failed=r.failed
    )


def network(book: HostBook) -> schema.Network:
    ifaces = []
    # By namespace and name; an interface re-created under its name (a new index) after the old one.
    for i in sorted(book.interfaces(), key=lambda i: (i.netns, i.last.name)):
        d, b, seconds = i.deltas, i.last, i.seconds
        ifaces.append(
            schema.InterfaceRow(
                netns=i.netns,
                host_namespace=i.host_namespace,
                interface=b.name,
                operstate=b.operstate,
                speed_bits_per_second=b.speed_bits_per_s,
                shaped_bits_per_second=b.shaped_bits_per_s,
                rx_bytes=d["rx_bytes"],
                tx_bytes=d["tx_bytes"],
                rx_packets=d["rx_packets"],
                tx_packets=d["tx_packets"],
                rx_errors=d["rx_errors"],
                tx_errors=d["tx_errors"],
                rx_dropped=d["rx_dropped"],
                tx_dropped=d["tx_dropped"],
                seconds=seconds,
                rx_bytes_per_second=d["rx_bytes"] / seconds if seconds else None,
                tx_bytes_per_second=d["tx_bytes"] / seconds if seconds else None,
                peak_utilization=i.peak_utilization,
                peak_rx_bytes_per_second=i.peak_rx_bytes_per_s,
                peak_tx_bytes_per_second=i.peak_tx_bytes_per_s,
                counter_resets=i.counter_resets,
            )
        )
    qdiscs = []
    for q in sorted(book.qdiscs(), key=lambda q: (q.last.netns, q.last.ifname, q.last.handle)):
        qd = q.deltas
        qb: QdiscSample = q.last
        qdiscs.append(
            schema.QdiscRow(
                netns=qb.netns,
                interface=qb.ifname,
                kind=qb.kind,
                handle=f"{qb.handle >> 16:x}:{qb.handle & 0xFFFF:x}",
                root=qb.parent == 0xFFFFFFFF,
                bytes=qd["bytes"],
                packets=qd["packets"],
                drops=qd["drops"],
                overlimits=qd["overlimits"],
                requeues=qd["requeues"],
                backlog_bytes=qb.backlog_bytes,
                peak_backlog_bytes=q.peak_backlog_bytes,
            )
        )
    return schema.Network(
        samples=book.net_samples,
        namespaces=[
            schema.NamespaceRow(netns=ns.inode, host_namespace=ns.host, pids=list(ns.pids)) for ns in book.namespaces()
        ],
        interfaces=ifaces,
        qdiscs=qdiscs,
        errors=sorted(book.net_errors),
    )


def collective_rows(
    book: HostBook,
    *,
    boot_wall_ns: int,
    attached: Mapping[ProcessKey, float],
    waits: Mapping[tuple[ProcessKey, Collective], tuple[int, int]],
) -> list[schema.CollectiveRow]:
    """The summary's `collectives`: per process and collective, calls and
    bytes; `attached`: when libnccl was attached, for a process that had it
    loaded before (its calls until then were not seen); `waits`: the
    model's collective_wait_totals, how long each process waited for each
    collective's work afterwards."""
    rows = []
    for (key, coll), t in sorted(book.collectives.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        since = attached.get(key)
        n, ns = waits.get((key, coll), (0, 0))
        when: _Attached = {} if since is None else {"attached_time_unix_nano": int(since * 1e9)}
        rows.append(
            schema.CollectiveRow(
                pid=key.pid,
                start_time_unix_nano=wall_start_ns(key, boot_wall_ns),
                collective=coll.label,
                calls=t.calls,
                bytes=t.bytes,
                bytes_unknown_calls=t.bytes_unknown,
                errors=t.errors,
                seconds=t.duration_ns / 1e9,
                counted_from="start" if since is None else "attach",
                **when,
                waits_attributed=n,
                wait_seconds=ns / 1e9,
            )
        )
    return rows


class _Attached(TypedDict, total=False):
    """CollectiveRow's attached_time_unix_nano, where it has one, in its place among the row's keys."""

    attached_time_unix_nano: int
