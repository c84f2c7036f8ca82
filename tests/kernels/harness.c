/* Runs memtrace's shipped BPF object inside a guest kernel the way the agent
 * does, against a workload with known truth, and prints what the kernel
 * counted.
 *
 *   harness OBJECT PLAN WORKLOAD [ARGS...]
 *   harness --load OBJECT        another sensor's object: load it, attach its
 *                                tracepoint programs, print "MT-LOAD OBJECT err"
 *   harness --nccl OBJECT PLAN WORKLOAD [ARGS...]
 *                                the NCCL sensor's communicator probes: PLAN
 *                                lines "PATH OFFSET COOKIE COMM" (COMM 1: a
 *                                communicator call, by the agent's plan); each
 *                                record of the `comms` ring printed as "MT-COMM
 *                                pid kind ret rank nranks color key comm parent
 *                                ID-HEX", the stats as "MT-NSTAT idx value"
 *
 * PLAN holds one probe a line, "PATH OFFSET COOKIE RETURN", written on the
 * host by memtrace.bpfsource.probe_plan (the agent's own symbol table and
 * cookie encoding; RETURN 0 is an entry-only launch probe). Like `memtrace
 * run`, the workload is forked gated, its pid put in `traced` before it
 * execs, and its children join through the fork tracepoint. The events are
 * summed here per (pid, api, direction as the kernel reports it), plus the
 * calls the kernel counted as lost. Output lines: "MT-TOTAL pid api dir calls
 * bytes errors", "MT-STAT idx value", "MT-EVENTS n", "MT-EXIT code".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/types.h>
#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include "memtrace.h"
#include "nccl.h"

static long events;

#define MAXKEYS 4096
static struct { struct mt_totals_key k; struct mt_totals t; } sums[MAXKEYS];
static int nsums;

static struct mt_totals *slot(__u32 pid, __u16 api, __u8 dir)
{
	for (int i = 0; i < nsums; i++)
		if (sums[i].k.pid == pid && sums[i].k.api == api && sums[i].k.direction == dir)
			return &sums[i].t;
	if (nsums == MAXKEYS) {
		fprintf(stderr, "harness: too many keys\n");
		exit(2);
	}
	sums[nsums].k.pid = pid, sums[nsums].k.api = api, sums[nsums].k.direction = dir;
	return &sums[nsums++].t;
}

static int on_event(void *ctx, void *data, size_t size)
{
	const struct mt_event *e = data;
	struct mt_totals *t;

	(void)ctx;
	if (size < sizeof(*e))
		return 0;
	if (e->api >= 40)
		return (events++, 0); /* not a copy */
	t = slot(e->pid, e->api, e->direction);
	if (e->ret == 0)
		t->bytes += e->bytes;
	if (e->layer & MT_EV_MORE)
		return 0; /* a further copy of a batch call: its bytes, not a call */
	events++;
	t->calls++;
	if (e->ret != 0)
		t->errors++;
	return 0;
}

static int on_ctl(void *ctx, void *data, size_t size)
{
	(void)ctx; (void)data; (void)size;
	return 0;
}

static void set_rodata(struct bpf_object *obj, const char *name, __u8 value)
{
	struct btf *btf = bpf_object__btf(obj);
	int id = btf__find_by_name_kind(btf, ".rodata", BTF_KIND_DATASEC);
	const struct btf_type *t = btf__type_by_id(btf, id);
	const struct btf_var_secinfo *v = btf_var_secinfos(t);
	size_t size;
	char *data = (char *)bpf_map__initial_value(bpf_object__find_map_by_name(obj, ".rodata"), &size);

	for (int i = 0; i < btf_vlen(t); i++, v++) {
		const char *n = btf__name_by_offset(btf, btf__type_by_id(btf, v->type)->name_off);
		if (strcmp(n, name) == 0) {
			data[v->offset] = value;
			return;
		}
	}
	fprintf(stderr, "harness: no option %s\n", name);
	exit(2);
}

static void die(const char *what)
{
	fprintf(stderr, "harness: %s: %s\n", what, strerror(errno));
	exit(2);
}

/* Does this kernel's verifier take the object, and its tracepoints attach? 0, or -errno. */
static int load_only(const char *path)
{
	struct bpf_object *obj = bpf_object__open_file(path, NULL);
	struct bpf_program *prog;

	if (!obj)
		return -errno;
	set_rodata(obj, "filter_pids", 1);
	if (bpf_object__load(obj))
		return -errno;
	bpf_object__for_each_program(prog, obj)
		if (strncmp(bpf_program__section_name(prog), "tp_btf/", 7) == 0 && !bpf_program__attach(prog))
			return -errno;
	return 0;
}

static int on_comm(void *ctx, void *data, size_t size)
{
	const struct nc_comm_event *e = data;

	(void)ctx;
	if (size < sizeof(*e))
		return 0;
	printf("MT-COMM %u %u %d %d %d %d %d %llu %llu ", e->pid, e->kind, e->ret, e->rank, e->nranks, e->color,
	       e->key, (unsigned long long)e->comm, (unsigned long long)e->parent);
	for (int i = 0; i < NC_UNIQUE_ID_BYTES; i++)
		printf("%02x", e->unique_id[i]);
	printf("\n");
	return 0;
}

/* The workload forked gated, traced (by pid; its start taken by BPF at its first call) before it execs. */
static pid_t start_gated(int map_fd, char **argv, int *gate_w)
{
	int gate[2];
	if (pipe(gate))
		die("pipe");
	pid_t child = fork();
	if (child == 0) {
		char c;
		close(gate[1]);
		if (read(gate[0], &c, 1) != 1)
			_exit(125);
		execv(argv[0], argv);
		_exit(127);
	}
	close(gate[0]);
	__u32 pid = child;
	__u64 start = 0;
	if (bpf_map_update_elem(map_fd, &pid, &start, BPF_ANY))
		die("trace pid");
	*gate_w = gate[1];
	return child;
}

static int run_nccl(char **argv)
{
	struct bpf_object *obj = bpf_object__open_file(argv[0], NULL);
	if (!obj)
		die("open object");
	set_rodata(obj, "filter_pids", 1);
	if (bpf_object__load(obj))
		die("load object");
	FILE *plan = fopen(argv[1], "r");
	char path[512];
	unsigned long off;
	unsigned long long cookie;
	int probes = 0, comm;
	struct bpf_program *enter = bpf_object__find_program_by_name(obj, "nc_comm_enter");
	struct bpf_program *ret = bpf_object__find_program_by_name(obj, "nc_comm_return");
	if (!plan)
		die("open plan");
	while (fscanf(plan, "%511s %lu %llu %d", path, &off, &cookie, &comm) == 4) {
		LIBBPF_OPTS(bpf_uprobe_opts, o, .bpf_cookie = cookie);
		if (!comm)
			continue;
		if (!bpf_program__attach_uprobe_opts(enter, -1, path, off, &o))
			die("attach entry");
		o.retprobe = true;
		if (!bpf_program__attach_uprobe_opts(ret, -1, path, off, &o))
			die("attach return");
		probes++;
	}
	printf("MT-PROBES %d\n", probes);
	fflush(stdout);
	struct ring_buffer *rb =
		ring_buffer__new(bpf_map__fd(bpf_object__find_map_by_name(obj, "comms")), on_comm, NULL, NULL);
	int gate, status;
	pid_t child = start_gated(bpf_map__fd(bpf_object__find_map_by_name(obj, "traced")), argv + 2, &gate);
	if (write(gate, "g", 1) != 1)
		die("release");
	while (waitpid(child, &status, WNOHANG) == 0) {
		ring_buffer__consume(rb);
		usleep(5000);
	}
	ring_buffer__consume(rb);
	int ncpu = libbpf_num_possible_cpus();
	__u64 vals[ncpu];
	int sfd = bpf_map__fd(bpf_object__find_map_by_name(obj, "stats"));
	for (__u32 i = 0; i < NC_STAT_COUNT; i++) {
		__u64 sum = 0;
		if (bpf_map_lookup_elem(sfd, &i, vals) == 0)
			for (int c = 0; c < ncpu; c++)
				sum += vals[c];
		printf("MT-NSTAT %u %llu\n", i, (unsigned long long)sum);
	}
	printf("MT-EXIT %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && strcmp(argv[1], "--nccl") == 0)
		return run_nccl(argv + 2);
	if (argc == 3 && strcmp(argv[1], "--load") == 0) {
		printf("MT-LOAD %s %d\n", argv[2], load_only(argv[2]));
		return 0;
	}
	if (argc < 4) {
		fprintf(stderr, "usage: harness OBJECT PLAN WORKLOAD [ARGS...]\n");
		return 2;
	}
	struct bpf_object *obj = bpf_object__open_file(argv[1], NULL);
	if (!obj)
		die("open object");
	set_rodata(obj, "filter_pids", 1);
	set_rodata(obj, "hold_libraries", 1);
	set_rodata(obj, "capture_stacks", 1); /* the stack walk must load and run on every kernel too */
	if (bpf_object__load(obj))
		die("load object");
	const char *progs[] = {"mt_fork", "mt_exit", "mt_mmap"};
	for (int i = 0; i < 3; i++)
		if (!bpf_program__attach(bpf_object__find_program_by_name(obj, progs[i])))
			die(progs[i]);

	FILE *plan = fopen(argv[2], "r");
	char path[512];
	unsigned long off;
	unsigned long long cookie;
	int probes = 0, with_return;
	struct bpf_program *enter = bpf_object__find_program_by_name(obj, "mt_enter");
	struct bpf_program *ret = bpf_object__find_program_by_name(obj, "mt_return");
	struct bpf_program *launch = bpf_object__find_program_by_name(obj, "mt_launch");
	if (!plan)
		die("open plan");
	while (fscanf(plan, "%511s %lu %llu %d", path, &off, &cookie, &with_return) == 4) {
		LIBBPF_OPTS(bpf_uprobe_opts, o, .bpf_cookie = cookie);
		if (!bpf_program__attach_uprobe_opts(with_return ? enter : launch, -1, path, off, &o))
			die("attach entry");
		o.retprobe = true;
		if (with_return && !bpf_program__attach_uprobe_opts(ret, -1, path, off, &o))
			die("attach return");
		probes++;
	}
	printf("MT-PROBES %d\n", probes);
	fflush(stdout);

	int gate[2];
	if (pipe(gate))
		die("pipe");
	pid_t child = fork();
	if (child == 0) {
		char c;
		close(gate[1]);
		setenv("WORKLOAD_RAW_DIRECTIONS", "1", 1);
		if (read(gate[0], &c, 1) != 1)
			_exit(125);
		execv(argv[3], argv + 3);
		_exit(127);
	}
	close(gate[0]);
	__u32 pid = child;
	__u8 one = 1;
	if (bpf_map_update_elem(bpf_map__fd(bpf_object__find_map_by_name(obj, "traced")), &pid, &one, BPF_ANY))
		die("trace pid");
	struct ring_buffer *rb =
		ring_buffer__new(bpf_map__fd(bpf_object__find_map_by_name(obj, "events")), on_event, NULL, NULL);
	ring_buffer__add(rb, bpf_map__fd(bpf_object__find_map_by_name(obj, "ctl_events")), on_ctl, NULL);
	if (write(gate[1], "g", 1) != 1)
		die("release");
	int status;
	while (waitpid(child, &status, WNOHANG) == 0) {
		ring_buffer__consume(rb);
		usleep(5000);
	}
	ring_buffer__consume(rb);

	int fd = bpf_map__fd(bpf_object__find_map_by_name(obj, "lost"));
	struct mt_totals_key k, next, *prev = NULL;
	struct mt_totals t;
	while (bpf_map_get_next_key(fd, prev, &next) == 0) {
		if (bpf_map_lookup_elem(fd, &next, &t) == 0 && next.api < 40) {
			struct mt_totals *s = slot(next.pid, next.api, next.direction);
			s->calls += t.calls, s->bytes += t.bytes, s->errors += t.errors;
		}
		k = next;
		prev = &k;
	}
	for (int i = 0; i < nsums; i++)
		printf("MT-TOTAL %u %u %u %llu %llu %llu\n", sums[i].k.pid, sums[i].k.api, sums[i].k.direction,
		       (unsigned long long)sums[i].t.calls, (unsigned long long)sums[i].t.bytes,
		       (unsigned long long)sums[i].t.errors);
	int ncpu = libbpf_num_possible_cpus();
	__u64 vals[ncpu];
	int sfd = bpf_map__fd(bpf_object__find_map_by_name(obj, "stats"));
	for (__u32 i = 0; i < MT_STAT_COUNT; i++) {
		__u64 sum = 0;
		if (bpf_map_lookup_elem(sfd, &i, vals) == 0)
			for (int c = 0; c < ncpu; c++)
				sum += vals[c];
		printf("MT-STAT %u %llu\n", i, (unsigned long long)sum);
	}
	printf("MT-EVENTS %ld\nMT-EXIT %d\n", events, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	return 0;
}
