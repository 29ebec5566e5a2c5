# fsdp - fully sharded data-parallel training in C.
#
#   make              build build/libfsdp.a and build/fsdp
#   make test         build and run every Check suite (the engine's again on
#                     asynchronous cpu streams: ASYNC_SUITES, ASYNC_JITTER)
#   make asan / tsan  the suites under AddressSanitizer+UBSan / ThreadSanitizer
#   make run          build (a job per core unless -j is given) and run the
#                     default training job
#   make bench        build the benchmarks in build/tools/

# ---- knobs -----------------------------------------------------------------
DEBUG     ?= 0
ASAN      ?= 0
TSAN      ?= 0
CUDA      ?= auto
ONEDNN    ?= auto
CUDA_HOME ?= /usr/local/cuda
# NCCL: auto (on when $(NCCL_HOME)/include/nccl.h exists), 1, or 0 (CUDA
# without NCCL: the peer collectives only). NCCL_LIB: the library to link by
# full path (a wheel's libnccl.so.2; its folder becomes the rpath), else
# -lnccl from $(NCCL_HOME)/lib.
NCCL      ?= auto
NCCL_HOME ?= $(CUDA_HOME)
NCCL_LIB  ?=
# Where cudart, cuBLAS and cuBLASLt are linked from (and found at run time).
CUDA_LIBDIR ?= $(CUDA_HOME)/lib64
# MPI: auto (on when $(MPICC), Open MPI's compiler wrapper, is found), 1, or 0
# (one process per job; `mpirun -np 1` still runs). MPIRUN: the launcher the
# tests use (`make test` runs 2-process jobs on loopback).
MPI       ?= auto
MPICC     ?= mpicc
MPIRUN    ?= mpirun
# INSTALL_DEPS=0: never run tools/install-deps.sh (offline machines).
INSTALL_DEPS ?= 1
# V=1: print every command; by default one line per build stage.
V         ?= 0
BUILD     ?= build
CC        ?= cc
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90

ifeq ($(ASAN)$(TSAN),11)
$(error ASAN=1 and TSAN=1 cannot be combined: the sanitizers' runtimes conflict)
endif

# ---- output ----------------------------------------------------------------
# V=0: commands are not echoed; $(call stage,NAME,what) prints one line the
# first time a recipe of stage NAME runs. Recipes are expanded just before
# they run, in make's own process, so only the first of a stage prints it,
# also under -j, and only when the stage has something to do. Compiler
# warnings and errors print as always.
ifeq ($(V),1)
  Q :=
  stage =
else
  Q := @
  stage = $(if $(stage_$(1)),,$(eval stage_$(1) := 1)@printf '  %-6s %s\n' '$(1)' '$(2)')
endif
# `make run` builds with a job per core unless -j is given (the command
# line's -j wins over this one).
ifneq ($(filter run,$(MAKECMDGOALS)),)
  MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
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
  ifeq ($(NCCL),auto)
    NCCL := $(if $(wildcard $(NCCL_HOME)/include/nccl.h),1,0)
  endif
  ifeq ($(NCCL),1)
    ifeq ($(wildcard $(NCCL_HOME)/include/nccl.h),)
      $(error NCCL=1 but nccl.h was not found under $(NCCL_HOME)/include; set NCCL_HOME, or NCCL=0 for the peer collectives only)
    endif
    ifneq ($(NCCL_LIB),)
      ifeq ($(wildcard $(NCCL_LIB)),)
        $(error NCCL_LIB=$(NCCL_LIB) does not exist)
      endif
    endif
  endif
else
  NCCL := 0
endif

MPICC_PATH := $(shell command -v $(MPICC) 2>/dev/null)
ifeq ($(MPI),auto)
  MPI := $(if $(MPICC_PATH),1,0)
endif
ifeq ($(MPI),1)
  ifeq ($(MPICC_PATH),)
    $(error MPI=1 but $(MPICC) was not found; install Open MPI (tools/install-deps.sh) or MPI=0)
  endif
  # Open MPI's wrapper says what it would add: its include and link flags.
  MPI_CFLAGS := $(shell $(MPICC) --showme:compile 2>/dev/null)
  MPI_LDLIBS := $(shell $(MPICC) --showme:link 2>/dev/null)
  ifeq ($(strip $(MPI_LDLIBS)),)
    $(error MPI=1 but '$(MPICC) --showme:link' says nothing: fsdp builds against Open MPI's wrapper)
  endif
  MPIRUN_PATH := $(shell command -v $(MPIRUN) 2>/dev/null)
endif

# libraries the library needs (cpu kernels, tokenizer patterns, Unicode
# normalization, checkpoint checksums) and, for the tests, Check. OpenBLAS is
# required but not linked: the cpu backend loads it at run time (below).
LIB_PKGS := openblas libpcre2-8 libutf8proc libxxhash
LINK_PKGS := $(filter-out openblas,$(LIB_PKGS))
PKGS := check $(LIB_PKGS)
HAVE_PKGS := $(shell pkg-config --exists $(PKGS) 2>/dev/null && echo 1)
ifneq ($(HAVE_PKGS),1)
  ifeq ($(filter clean,$(MAKECMDGOALS)),)
    ifeq ($(INSTALL_DEPS),1)
      $(info fsdp: pkg-config does not find '$(PKGS)'; running tools/install-deps.sh)
      DEPS_RC := $(shell tools/install-deps.sh >&2; echo $$?)
      HAVE_PKGS := $(shell pkg-config --exists $(PKGS) 2>/dev/null && echo 1)
    endif
    ifneq ($(HAVE_PKGS),1)
      $(error missing build dependencies: run 'sudo tools/install-deps.sh' (Debian/Ubuntu), or point PKG_CONFIG_PATH at Check and OpenBLAS)
    endif
  endif
endif

# The cpu backend's GEMMs (src/ops/cpu/blas.h): OpenBLAS is loaded at run
# time (dlopen, so that its kernel can be chosen), never linked; oneDNN 2.x,
# when found, runs bf16 GEMMs on CPUs with bf16 dot products (dnnl.c, else
# dnnl_none.c).
DNNL_H := $(firstword $(wildcard /usr/include/oneapi/dnnl/dnnl_version.h \
            /usr/local/include/oneapi/dnnl/dnnl_version.h))
DNNL_VERSION := $(if $(DNNL_H),$(shell sed -n 's/^\#define DNNL_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' $(DNNL_H) | paste -sd.))
ifeq ($(ONEDNN),auto)
  ONEDNN := $(if $(filter 2.%,$(DNNL_VERSION)),1,0)
endif
ifeq ($(ONEDNN),1)
  ifeq ($(filter 2.%,$(DNNL_VERSION)),)
    $(error ONEDNN=1 but oneDNN 2.x headers were not found (found: '$(DNNL_VERSION)'); install libdnnl-dev or set ONEDNN=0)
  endif
  DNNL_SKIP := src/ops/cpu/dnnl_none.c
  DNNL_LIBS := -ldnnl -lgomp
else
  DNNL_SKIP := src/ops/cpu/dnnl.c
  DNNL_LIBS :=
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
LDLIBS  := $(DNNL_LIBS) $(shell pkg-config --libs $(LINK_PKGS) 2>/dev/null) -ldl -lm -lpthread
TEST_LIBS := $(shell pkg-config --libs check 2>/dev/null)
LDFLAGS := $(SAN)

SRC_C := $(wildcard src/*/*.c src/*/*/*.c models/*.c)
SRC_C := $(filter-out src/cli/% $(DNNL_SKIP),$(SRC_C))
SRC_CU :=
NCCL_LDLIBS :=
ifeq ($(CUDA),1)
  SRC_C  := $(filter-out %_stub.c,$(SRC_C))
  SRC_CU := $(wildcard src/*/*.cu src/*/*/*.cu)
  ifeq ($(NCCL),1)
    CFLAGS += -DFSDP_NCCL=1
    ifneq ($(NCCL_LIB),)
      NCCL_LDLIBS := $(abspath $(NCCL_LIB)) -Wl,-rpath,$(abspath $(dir $(NCCL_LIB)))
    else
      NCCL_LDLIBS := -L$(NCCL_HOME)/lib -Wl,-rpath,$(NCCL_HOME)/lib -lnccl
    endif
  else
    SRC_CU := $(filter-out src/comm/nccl.cu,$(SRC_CU))
    SRC_C  += src/comm/nccl_stub.c
  endif
  CFLAGS += -DFSDP_CUDA=1 -I$(CUDA_HOME)/include
  LDLIBS += $(NCCL_LDLIBS) -L$(CUDA_LIBDIR) -Wl,-rpath,$(abspath $(CUDA_LIBDIR)) \
            -lcublasLt -lcublas -lcudart -lstdc++
endif
# MPI: mpi_procs.c against Open MPI, or mpi_stub.c (after the CUDA filter,
# which drops every *_stub.c).
SRC_C := $(filter-out src/comm/mpi_procs.c src/comm/mpi_stub.c,$(SRC_C))
ifeq ($(MPI),1)
  SRC_C += src/comm/mpi_procs.c
  LDLIBS += $(MPI_LDLIBS)
else
  SRC_C += src/comm/mpi_stub.c
endif
NVFLAGS := -O3 -std=c++17 $(CUDA_ARCH) -I. -Iinclude -Isrc -Imodels -DFSDP_CUDA=1 \
           $(if $(filter 1,$(NCCL)),-I$(NCCL_HOME)/include) -Xcompiler -fPIC,-Wall -lineinfo \
           $(EXTRA_NVFLAGS)

OBJ := $(SRC_C:%.c=$(BUILD)/obj/%.o) $(SRC_CU:%.cu=$(BUILD)/obj/%.cu.o)
LIB := $(BUILD)/libfsdp.a
BIN := $(BUILD)/fsdp
CLI_SRC := $(wildcard src/cli/*.c)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# Helpers every suite links (tests/testutil.c), built once.
TEST_COMMON := $(filter-out $(TEST_SRC),$(wildcard tests/*.c))
TEST_COMMON_OBJ := $(TEST_COMMON:%.c=$(BUILD)/obj/%.o)
TOOL_SRC := $(wildcard tools/*.c)
TOOL_BIN := $(TOOL_SRC:tools/%.c=$(BUILD)/tools/%)

.PHONY: all test asan tsan run bench clean info
all: info $(LIB) $(BIN)

info:
	@echo "fsdp: cc $(shell $(CC) -dumpversion 2>/dev/null) | cuda: $(if $(filter 1,$(CUDA)),found ($(NVCC)),off) | nccl: $(if $(filter 1,$(NCCL)),$(or $(NCCL_LIB),$(NCCL_HOME)),off) | mpi: $(if $(filter 1,$(MPI)),found ($(MPICC_PATH)$(if $(MPIRUN_PATH),,; no $(MPIRUN): multi-process tests skip)),off) | $(PKGS): $(if $(HAVE_PKGS),found,MISSING) | onednn: $(if $(filter 1,$(ONEDNN)),$(DNNL_VERSION),off (bf16 GEMMs in fp32))"

# The cpu op kernels are auto-vectorised. Neither flag lets the compiler
# reassociate or contract arithmetic, so results stay bit-identical.
$(BUILD)/obj/src/ops/cpu/%.o: CFLAGS += -ftree-vectorize -fvect-cost-model=dynamic -fno-trapping-math
# So is the normal draw's block (rng.c), which also needs sqrt without errno.
$(BUILD)/obj/src/core/rng.o: CFLAGS += -ftree-vectorize -fvect-cost-model=dynamic -fno-trapping-math \
                                       -fno-math-errno
$(BUILD)/obj/src/comm/mpi_procs.o: CFLAGS += $(MPI_CFLAGS)
# The multi-process suites launch jobs with this mpirun ("" without MPI: skipped).
$(BUILD)/tests/test_mpi_procs $(BUILD)/tests/test_mpi_train \
$(BUILD)/tests/test_mpi_jobs: CFLAGS += -DFSDP_MPIRUN='"$(MPIRUN_PATH)"'

$(BUILD)/obj/%.o: %.c
	$(call stage,CC,C sources -> $(BUILD)/obj/ (V=1 prints the commands))
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	$(call stage,NVCC,CUDA kernels -> $(BUILD)/obj/ (the longest stage: minutes))
	@mkdir -p $(dir $@)
	$(Q)$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(OBJ)
	$(call stage,AR,$@)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB)
	$(call stage,LD,$@)
	$(Q)$(CC) $(LDFLAGS) $(CLI_OBJ) $(LIB) $(LDLIBS) -o $@

# Tests may run the command itself (test_cli): it is built first and its
# path is passed in.
$(TEST_COMMON_OBJ): CFLAGS += -DFSDP_BIN='"$(BIN)"'
$(BUILD)/tests/%: tests/%.c $(TEST_COMMON_OBJ) $(wildcard tests/*.h) $(LIB) $(BIN)
	$(call stage,TESTS,test suites -> $(BUILD)/tests/)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) -DFSDP_BIN='"$(BIN)"' $< $(TEST_COMMON_OBJ) $(LIB) $(LDFLAGS) $(TEST_LIBS) $(LDLIBS) -o $@

$(BUILD)/tools/%: tools/%.c $(LIB)
	$(call stage,TOOLS,benchmarks -> $(BUILD)/tools/)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CFLAGS) $< $(LIB) $(LDFLAGS) $(LDLIBS) -o $@

# The suites that run a second time on asynchronous cpu streams with random
# delays (tools/run_tests.sh --async): the engine's bit-identity matrix,
# the golden trajectory, checkpoint round trips, several processes, faults,
# frozen segments and LoRA against PEFT, the host collectives, the cpu ops.
# A ThreadSanitizer build runs the heaviest of them only (time).
ASYNC_SUITES ?= $(if $(filter 1,$(TSAN)),test_engine test_ckpt,test_engine test_golden \
                test_ckpt test_compat test_llama test_model test_mpi_train test_mpi_jobs \
                test_faults test_optim_train test_train_errors test_hostile test_frozen \
                test_lora_train test_comm test_mpi test_ops test_ops_llama test_ops_lora test_cpu)
ASYNC_JITTER ?= 1
# Cases the ThreadSanitizer build's asynchronous pass leaves out (time on CI's
# 2 cores): test_engine's recompute matrix, which runs on async streams in
# make test and inline under TSan (2026-12-02: 72 of its 170 s there).
ASYNC_EXCLUDE ?= $(if $(filter 1,$(TSAN)),recompute)
# Suites a ThreadSanitizer build leaves out: none of their code runs on a
# second thread (no rank, stream, team or command threads: counted with a
# pthread_create hook over make test, 2026-12-02), so TSan has nothing to
# check there; make test and make asan run them. A suite that starts
# threads must not be listed.
TSAN_SKIP ?= test_cuda test_cuda_llama test_cuda_ops test_hfdir_hostile test_jinja test_json \
             test_llmc test_names test_registry test_safetensors test_shard test_tokenizer
TEST_RUN := $(if $(filter 1,$(TSAN)),$(filter-out $(TSAN_SKIP:%=$(BUILD)/tests/%),$(TEST_BIN)),$(TEST_BIN))
test: all $(TEST_BIN)
	@ASYNC_EXCLUDE="$(ASYNC_EXCLUDE)" tools/run_tests.sh $(TEST_RUN) --async $(ASYNC_JITTER) \
	    $(ASYNC_SUITES:%=$(BUILD)/tests/%)

# Sanitizer builds leave CUDA out: cudart's own mappings trip ASan's shadow
# checks and TSan cannot see inside the driver; the CUDA tests need a GPU anyway.
asan:
	@$(MAKE) --no-print-directory BUILD=build-asan ASAN=1 CUDA=0 test
tsan:
	@TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 $(TSAN_OPTIONS)" \
	 $(MAKE) --no-print-directory BUILD=build-tsan TSAN=1 CUDA=0 test

run: all
	$(call stage,RUN,$(BIN) train)
	$(Q)$(BIN) train

bench: all $(TOOL_BIN)

clean:
	rm -rf build build-asan build-tsan

-include $(OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_COMMON_OBJ:.o=.d)

# ---- fuzzing ---------------------------------------------------------------
# make fuzz [FUZZ_SECONDS=60] [FUZZ_JOBS=N] [FUZZ_PARALLEL=P]: one libFuzzer target per file
# reader (tests/fuzz/fuzz_*.c), built with clang -fsanitize=fuzzer,address,
# undefined into build-fuzz/ (the library's cpu sources included, with
# coverage), each run for FUZZ_SECONDS on its seed corpus
# tests/fuzz/corpus/<target>/, P targets at a time (default: one per core;
# tools/run_fuzz.sh); inputs it finds go to build-fuzz/corpus/<target>/ and
# failing inputs to build-fuzz/<target>-crash-* (make fails). Needs
# clang and its libFuzzer runtime (Debian: clang libclang-rt-14-dev).
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_JOBS    ?= 1
FUZZ_PARALLEL ?= $(shell nproc 2>/dev/null || echo 1)
FUZZ_DIR     := build-fuzz
FUZZ_SRC     := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN     := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_DIR)/%)
FUZZ_LIB_SRC := $(filter-out src/cli/% src/comm/mpi_procs.c $(DNNL_SKIP),$(wildcard src/*/*.c src/*/*/*.c models/*.c))
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=$(FUZZ_DIR)/obj/%.o)
FUZZ_CFLAGS  := $(CFLAGS_BASE) -Wno-unknown-warning-option -O1 -g -fno-omit-frame-pointer -ffp-contract=off \
                -fsanitize=address,undefined -fno-sanitize-recover=undefined \
                $(shell pkg-config --cflags $(LIB_PKGS) 2>/dev/null)
FUZZ_LIBS    := $(DNNL_LIBS) $(shell pkg-config --libs $(LINK_PKGS) 2>/dev/null) -ldl -lm -lpthread

.PHONY: fuzz fuzz-build
.SECONDARY: $(FUZZ_LIB_OBJ)
fuzz-build: fuzz-check $(FUZZ_BIN)

.PHONY: fuzz-check
fuzz-check:
	@command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: $(FUZZ_CC) not found; install clang \
	(Debian: apt-get install clang libclang-rt-14-dev) or set FUZZ_CC"; exit 1; }

fuzz: fuzz-build
	@tools/run_fuzz.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZ_JOBS) $(FUZZ_PARALLEL) $(FUZZ_BIN)

$(FUZZ_DIR)/obj/%.o: %.c
	$(call stage,CC,C sources with coverage -> $(FUZZ_DIR)/obj/)
	@mkdir -p $(dir $@)
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_common.h $(FUZZ_LIB_OBJ)
	$(call stage,FUZZ,fuzz targets -> $(FUZZ_DIR)/)
	@mkdir -p $(dir $@)
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB_OBJ) $(FUZZ_LIBS) -o $@

-include $(FUZZ_LIB_OBJ:.o=.d)
