# fsdp - fully sharded data-parallel training in C.
#
#   make              build build/libfsdp.a and build/fsdp
#   make test         build and run every Check suite
#   make asan / tsan  the suites under AddressSanitizer+UBSan / ThreadSanitizer
#   make run          build and run the default training job
#   make bench        build the benchmarks in build/tools/

# ---- knobs -----------------------------------------------------------------
DEBUG     ?= 0
ASAN      ?= 0
TSAN      ?= 0
CUDA      ?= auto
CUDA_HOME ?= /usr/local/cuda
NCCL_HOME ?= $(CUDA_HOME)
BUILD     ?= build
CC        ?= cc
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90

ifeq ($(ASAN)$(TSAN),11)
$(error ASAN=1 and TSAN=1 cannot be combined: the sanitizers' runtimes conflict)
endif

# ---- toolchains and dependencies ------------------------------------------
ifeq ($(CUDA),auto)
  ifneq ($(wildcard $(NVCC)),)
    CUDA := 1
  else
    CUDA := 0
  endif
endif
ifeq ($(CUDA),1)
  ifeq ($(wildcard $(NVCC)),)
    $(error CUDA=1 but nvcc was not found at $(NVCC); set CUDA_HOME or CUDA=0)
  endif
  ifeq ($(wildcard $(NCCL_HOME)/include/nccl.h),)
    $(error CUDA=1 but nccl.h was not found under $(NCCL_HOME)/include; set NCCL_HOME)
  endif
endif

PKGS := check openblas
HAVE_PKGS := $(shell pkg-config --exists $(PKGS) 2>/dev/null && echo 1)
ifneq ($(HAVE_PKGS),1)
  ifeq ($(filter clean,$(MAKECMDGOALS)),)
    $(info fsdp: pkg-config does not find '$(PKGS)'; running tools/install-deps.sh)
    DEPS_RC := $(shell tools/install-deps.sh >&2; echo $$?)
    HAVE_PKGS := $(shell pkg-config --exists $(PKGS) 2>/dev/null && echo 1)
    ifneq ($(HAVE_PKGS),1)
      $(error missing build dependencies: run 'sudo tools/install-deps.sh' (Debian/Ubuntu))
    endif
  endif
endif

CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -pthread \
               -I. -Iinclude -Isrc -Imodels -Itests
ifeq ($(DEBUG),1)
  OPT := -O0 -g
else
  OPT := -O2 -g -march=x86-64-v2 -mtune=native
endif
SAN :=
ifeq ($(ASAN),1)
  SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
ifeq ($(TSAN),1)
  SAN := -fsanitize=thread -fno-omit-frame-pointer
endif
# Floating-point contraction is controlled explicitly: no implicit FMA, so
# the scalar and vectorised paths and every build agree bit for bit.
CFLAGS  := $(CFLAGS_BASE) $(OPT) $(SAN) -ffp-contract=off \
           $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(EXTRA_CFLAGS)
LDLIBS  := $(shell pkg-config --libs openblas 2>/dev/null) -lm -lpthread
TEST_LIBS := $(shell pkg-config --libs check 2>/dev/null)
LDFLAGS := $(SAN)

SRC_C := $(wildcard src/*/*.c src/*/*/*.c models/*.c)
SRC_C := $(filter-out src/cli/%,$(SRC_C))
SRC_CU :=
ifeq ($(CUDA),1)
  SRC_C  := $(filter-out %_stub.c,$(SRC_C))
  SRC_CU := $(wildcard src/*/*.cu src/*/*/*.cu)
  CFLAGS += -DFSDP_CUDA=1 -I$(CUDA_HOME)/include -I$(NCCL_HOME)/include
  LDLIBS += -L$(CUDA_HOME)/lib64 -L$(NCCL_HOME)/lib -Wl,-rpath,$(CUDA_HOME)/lib64 \
            -lcublasLt -lcublas -lnccl -lcudart -lstdc++
endif
NVFLAGS := -O3 -std=c++17 $(CUDA_ARCH) -I. -Iinclude -Isrc -Imodels -DFSDP_CUDA=1 \
           -I$(NCCL_HOME)/include -Xcompiler -fPIC,-Wall -lineinfo $(EXTRA_NVFLAGS)

OBJ := $(SRC_C:%.c=$(BUILD)/obj/%.o) $(SRC_CU:%.cu=$(BUILD)/obj/%.cu.o)
LIB := $(BUILD)/libfsdp.a
BIN := $(BUILD)/fsdp
CLI_SRC := $(wildcard src/cli/*.c)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_COMMON := $(filter-out $(TEST_SRC),$(wildcard tests/*.c))
TOOL_SRC := $(wildcard tools/*.c)
TOOL_BIN := $(TOOL_SRC:tools/%.c=$(BUILD)/tools/%)

.PHONY: all test asan tsan run bench clean info
all: info $(LIB) $(BIN)

info:
	@echo "fsdp: cc $(shell $(CC) -dumpversion 2>/dev/null) | cuda: $(if $(filter 1,$(CUDA)),found ($(NVCC)),off) | check+openblas: $(if $(HAVE_PKGS),found,MISSING)"

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) $(CLI_OBJ) $(LIB) $(LDLIBS) -o $@

# Tests may run the command itself (test_cli): it is built first and its
# path is passed in.
$(BUILD)/tests/%: tests/%.c $(TEST_COMMON) $(LIB) $(BIN)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DFSDP_BIN='"$(BIN)"' $< $(TEST_COMMON) $(LIB) $(LDFLAGS) $(TEST_LIBS) $(LDLIBS) -o $@

$(BUILD)/tools/%: tools/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(LIB) $(LDFLAGS) $(LDLIBS) -o $@

test: all $(TEST_BIN)
	@tools/run_tests.sh $(TEST_BIN)

# Sanitizer builds leave CUDA out: cudart's own mappings trip ASan's shadow
# checks and TSan cannot see inside the driver; the CUDA tests need a GPU anyway.
asan:
	@$(MAKE) --no-print-directory BUILD=build-asan ASAN=1 CUDA=0 test
tsan:
	@TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 $(TSAN_OPTIONS)" \
	 $(MAKE) --no-print-directory BUILD=build-tsan TSAN=1 CUDA=0 test

run: all
	$(BIN) train

bench: all $(TOOL_BIN)

clean:
	rm -rf build build-asan build-tsan

-include $(OBJ:.o=.d) $(CLI_OBJ:.o=.d)
