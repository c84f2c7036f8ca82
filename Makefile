# memtrace build: per-arch CO-RE objects, shipped inside the Python package.
#
#   make            build memtrace/bpf/<sensor>.{x86,arm64}.bpf.o for each sensor in SENSORS
#   make check-objects   rebuild into a scratch dir and compare with the shipped bytes
#   make vmlinux-x86     regenerate vmlinux/x86/vmlinux.h from this host's BTF
#   make vmlinux-arm64   regenerate vmlinux/arm64/vmlinux.h from Debian's arm64 kernel
#   make test-fast       the tests that need no root, no backend and no qemu (after scripts/setup.sh --dev)

CLANG ?= clang
ARCHES := x86 arm64
OUT ?= memtrace/bpf
# One object per sensor and arch, each from bpf/<sensor>.bpf.c and the headers it includes.
SENSORS := memtrace sched nccl
# Every object depends on every header: a change to one rebuilds each object
# that includes it (and the few that do not, which costs seconds).
HEADERS := $(wildcard bpf/*.h)

# Stable flags so the same sources give the same bytes on any checkout path.
BPF_CFLAGS := -O2 -g -target bpf -fno-ident -Wall -Werror \
	-fdebug-prefix-map=$(CURDIR)=. -fmacro-prefix-map=$(CURDIR)=. \
	-fdebug-compilation-dir=. -I bpf

OBJS := $(foreach s,$(SENSORS),$(foreach a,$(ARCHES),$(OUT)/$(s).$(a).bpf.o))

.PHONY: all check-objects clean vmlinux-x86 vmlinux-arm64 test-fast
all: $(OBJS)

define sensor_rule
$$(OUT)/$(1).%.bpf.o: bpf/$(1).bpf.c $$(HEADERS) vmlinux/%/vmlinux.h
	@mkdir -p $$(OUT)
	$$(CLANG) $$(BPF_CFLAGS) -D__TARGET_ARCH_$$* -I vmlinux/$$* -c $$< -o $$@
	llvm-strip -g $$@
endef
$(foreach s,$(SENSORS),$(eval $(call sensor_rule,$(s))))

check-objects:
	@tmp=$$(mktemp -d) && $(MAKE) -s --always-make OUT=$$tmp $(foreach s,$(SENSORS),$(foreach a,$(ARCHES),$$tmp/$(s).$(a).bpf.o)) && \
	for o in $(foreach s,$(SENSORS),$(foreach a,$(ARCHES),$(s).$(a).bpf.o)); do cmp $$tmp/$$o $(OUT)/$$o || \
	  { echo "$$o is stale: run make" >&2; exit 1; }; done; rm -rf $$tmp; echo "shipped objects match sources"

vmlinux-x86:
	bpftool btf dump file /sys/kernel/btf/vmlinux format c > vmlinux/x86/vmlinux.h

vmlinux-arm64:
	vmlinux/gen-arm64.sh > vmlinux/arm64/vmlinux.h

clean:
	rm -f $(OBJS)

# Under a minute, as any user: what loads no BPF, makes no cgroup or namespace,
# starts no backend, boots no kernel and is not marked slow (pyproject.toml).
test-fast:
	.venv/bin/python -m pytest -q -p no:cacheprovider -m "not bpf and not root and not qemu and not e2e and not slow"
