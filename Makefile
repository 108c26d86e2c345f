# cnn.c — build, set up, test, benchmark.
#
#   make run     install missing Debian packages, make data/mnist, build, train models/mnist.cfg
#   make test    install missing packages, build, run the cmocka suites
#   make bench   throughput against PyTorch (python3-torch) on the same cores
#   make SAN=1 test   the suites under AddressSanitizer + UBSan
#   make test-arch    the x86-64 baseline (no AVX), AVX2 without AVX-512 and arm64, under qemu
#
# Objects go to build/ (build/san with SAN=1). The CUDA backend is built when nvcc is
# found (or CUDA=1), as libcnn_cuda.so, loaded when device=cuda is used.

CC      ?= gcc
# The target's Debian multiarch triplet (x86_64-linux-gnu, aarch64-linux-gnu): where its
# libraries and OpenBLAS's headers live. CC=aarch64-linux-gnu-gcc cross-builds for arm64.
MULTIARCH := $(or $(shell $(CC) -print-multiarch 2>/dev/null),$(shell $(CC) -dumpmachine))
# The baseline every object is compiled for: any x86-64 CPU (or any arm64 one). The CPU
# kernels are compiled a second time for AVX2 + FMA + F16C (what x86-64-v3 adds that they
# use), and nn/cpu.c picks that table at run time where the CPU has them (issue 36).
ifneq ($(filter x86_64-%,$(MULTIARCH)),)
  ARCH    ?= -march=x86-64 -mtune=generic
  CPU_SETS := avx2
endif
CFLAGS  ?= -O3 $(ARCH)
# An undeclared function is an error: a header missing at build time (cblas.h before
# libopenblas-dev is installed) otherwise truncates returned pointers to int, and ./train crashes.
CFLAGS  += -std=c11 -ffp-contract=off -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration \
           -fopenmp -MMD -MP -I/usr/include/$(MULTIARCH)/openblas-pthread
LDLIBS  += -lopenblas -lstb -ljpeg -lz -lm -lpthread -fopenmp

# The build's Debian packages unpacked from .deb files into a folder, for a machine that has
# neither them nor a network (the GPU machine: gpu/fetch_debs.sh, gpu/run.sh):
# DEPS_PREFIX=/that/folder takes headers and libraries from it and installs nothing.
INSTALL_PACKAGES := sh data/install_packages.sh
ifneq ($(DEPS_PREFIX),)
  DEPS_PREFIX := $(abspath $(DEPS_PREFIX))
  CFLAGS  += -I$(DEPS_PREFIX)/usr/include -I$(DEPS_PREFIX)/usr/include/$(MULTIARCH) \
             -I$(DEPS_PREFIX)/usr/include/$(MULTIARCH)/openblas-pthread
  DEPS_LIBDIRS := $(addprefix $(DEPS_PREFIX)/,usr/lib/$(MULTIARCH) \
                  usr/lib/$(MULTIARCH)/openblas-pthread lib/$(MULTIARCH))
  LDLIBS  := $(foreach d,$(DEPS_LIBDIRS),-L$(d) -Wl,-rpath,$(d)) $(LDLIBS)
  INSTALL_PACKAGES := : installs nothing with DEPS_PREFIX:
endif

BUILD   := build
# SAN=1: AddressSanitizer and UBSan, whose first report ends the program (a test fails).
ifeq ($(SAN),1)
  CFLAGS  := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
             $(filter-out -O3,$(CFLAGS))
  LDLIBS  += -fsanitize=address,undefined
  BUILD   := build/san
endif

NN_SRC    := $(wildcard nn/*.c)
DATA_SRC  := $(wildcard data/*.c)
LIB_SRC   := $(NN_SRC) $(DATA_SRC)
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CPU_SETS:%=$(BUILD)/nn/cpu_kernels_%.o)

# CUDA backend, when the toolkit is here: a shared library that nn/cuda_loader.c loads
# on the first use of device=cuda, so CPU runs never map the CUDA libraries.
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(CUDA),)
  CUDA := $(if $(NVCC),1,0)
endif
GPU_SRC := $(wildcard gpu/*.cu)
CUDA_LIB :=
ifeq ($(CUDA)$(if $(GPU_SRC),y,n),1y)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  NVFLAGS   ?= -O3 -std=c++17 -Xcompiler -fPIC -gencode arch=compute_75,code=sm_75 \
               -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
               -gencode arch=compute_90,code=compute_90
  CUDA_LIB  := libcnn_cuda.so
endif
$(BUILD)/nn/cuda_loader.o: CFLAGS += -DCNN_CUDA_LIB='"$(abspath $(CUDA_LIB))"'
# sqrtf without errno: the optimizer loops vectorise (the same values; nothing reads errno).
$(BUILD)/nn/cpu_kernels.o: CFLAGS += -fno-math-errno
LDLIBS  += -ldl

# Data parallelism over MPI (nn/dist.c) when mpicc is found (or MPI=1); MPI=0 builds without.
MPICC   ?= $(shell command -v mpicc 2>/dev/null)
ifeq ($(MPI),)
  MPI := $(if $(MPICC),1,0)
endif
ifeq ($(MPI),1)
  $(BUILD)/nn/dist.o: CFLAGS += -DCNN_MPI $(shell $(MPICC) --showme:compile)
  LDLIBS += $(shell $(MPICC) --showme:link)
endif

# The trainer's own jobs besides training (cli/): options, --eval, --predict, the metrics
# log, resuming, the save folder; linked into ./train and the predict fuzz target.
CLI_SRC   := $(wildcard cli/*.c)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/%.o)

# BIN_DIR=folder/ puts ./train and ./ckpt there (a cross build's, beside its objects).
BINS      := $(BIN_DIR)train $(BIN_DIR)ckpt
TEST_SRC  := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: all run test test-arch deps-arch test-gpu test-gpu-replay gpu-debs bench bench-depthwise deps deps-test deps-bench deps-fuzz fuzz data photos clean
all: $(BINS) $(CUDA_LIB)

# Objects record the compiler and flags that made them: a change of CC, ARCH or CFLAGS
# (the baseline's -march, say) rebuilds them instead of linking stale ones.
CFLAGS_STAMP := $(BUILD)/cflags
$(shell mkdir -p $(BUILD); [ "$$(cat $(CFLAGS_STAMP) 2>/dev/null)" = '$(CC) $(CFLAGS)' ] || echo '$(CC) $(CFLAGS)' > $(CFLAGS_STAMP))

$(BUILD)/%.o: %.c $(CFLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# nn/cpu_kernels.c once for each table (nn/cpu.c chooses): the baseline's, and AVX2's.
# The Winograd loops pass 32-byte vectors between inlined functions, and the AVX2 object's
# direct convolution 64-byte ones, whose ABI gcc warns about in an object compiled without
# AVX (AVX-512): nothing calls them across objects.
$(BUILD)/nn/cpu_kernels.o: CFLAGS += -DCPU_KERNEL_SET=cpu_kernels_portable -Wno-psabi
# gcc 12.2's arm64 vectorizer stops with an internal error on a reduction in this suite
# (vect_transform_reduction, test_microbatches_accumulate): a test, not a kernel.
$(BUILD)/tests/test_net.o: CFLAGS += $(if $(filter aarch64-%,$(MULTIARCH)),-fno-tree-vectorize)
AVX2_FLAGS := -mavx2 -mfma -mf16c -DCPU_KERNEL_SET=cpu_kernels_avx2 -Wno-psabi
$(BUILD)/nn/cpu_kernels_avx2.o: nn/cpu_kernels.c $(CFLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -c $< -o $@

# No kernel may use local memory (a thread's arrays, spilled registers): a GPU reserves it
# for every thread it can hold, outside the plan (act_pack's 2.3 KB a thread took 350 MB of
# an H200), and it is slow. ptxas stops the build at any.
NVCHECK := -Xptxas -warn-lmem-usage,-warn-spills,-Werror
$(BUILD)/gpu/%.o: gpu/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(NVCHECK) -MMD -MP -c $< -o $@

# The toolkit's libraries by rpath: a machine whose loader does not list them still finds them.
libcnn_cuda.so: $(GPU_SRC:%.cu=$(BUILD)/%.o) $(BUILD)/gpu/error.pic.o
	$(NVCC) -shared $^ -o $@ -L$(CUDA_HOME)/lib64 -Xlinker -rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas

$(BUILD)/gpu/error.pic.o: nn/error.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(BUILD)/libcnn.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# ./train and ./ckpt live outside build/, so they record which build made them: a plain
# `make` after `make SAN=1` (or the other way round) relinks them instead of keeping the
# other kind.
BIN_FLAGS := $(or $(BIN_DIR),build/)bin-flags
$(shell mkdir -p $(dir $(BIN_FLAGS)); [ "$$(cat $(BIN_FLAGS) 2>/dev/null)" = "$(BUILD)" ] || echo "$(BUILD)" > $(BIN_FLAGS))

$(BIN_DIR)train: $(BUILD)/train.o $(CLI_OBJ) $(BUILD)/libcnn.a $(BIN_FLAGS)
	$(CC) $(CFLAGS) $(filter-out $(BIN_FLAGS),$^) -o $@ $(LDLIBS)

$(BIN_DIR)ckpt: $(BUILD)/ckpt.o $(BUILD)/libcnn.a $(BIN_FLAGS)
	$(CC) $(CFLAGS) $(filter-out $(BIN_FLAGS),$^) -o $@ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libcnn.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# The fault-injection library that tests/test_faults.c preloads into ./train: never
# sanitized (with SAN=1, the files-only build; ASan's allocator is limited by its options).
$(BUILD)/tests/libfault.so: tests/fault_inject.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -std=c11 -Wall -Wextra -fPIC -shared $(if $(filter 1,$(SAN)),-DFAULT_FILES_ONLY) $< -o $@ -ldl
$(BUILD)/tests/test_faults: | $(BUILD)/tests/libfault.so

# Every suite links the shared helpers of tests/testutil.c.
$(TEST_BINS): $(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/tests/testutil.o $(BUILD)/libcnn.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -lcmocka

# ---- set-up ----------------------------------------------------------------------------
DEPS_BUILD := gcc make libopenblas-dev libcmocka-dev libstb-dev libjpeg62-turbo-dev zlib1g-dev
# tests/test_torchvision.c checks models/resnet18.cfg against torchvision's ResNet-18.
DEPS_TEST  := $(DEPS_BUILD) python3-torch python3-torchvision libopenmpi-dev openmpi-bin
deps-test:
	@$(INSTALL_PACKAGES) $(DEPS_TEST)
deps:
	@$(INSTALL_PACKAGES) $(DEPS_BUILD) dataset-fashion-mnist \
	   $(if $(shell command -v npm 2>/dev/null),,nodejs npm)
deps-bench: deps
	@$(INSTALL_PACKAGES) python3-torch python3-torchvision

# A demo folder of photo-like JPEGs for models/folder.cfg: 3,000 Fashion-MNIST images
# upscaled to 600x600 and coloured, one subfolder per class (bench/make_folders.c).
photos: data/photos/.complete
data/photos/.complete:
	$(MAKE) deps $(BUILD)/bench/make_folders
	$(BUILD)/bench/make_folders data/photos jpg600 3000

data: data/mnist/train-images-idx3-ubyte
data/mnist/train-images-idx3-ubyte:
	sh data/make_mnist.sh

run: deps
	$(MAKE) data all
	./train models/mnist.cfg

test: deps-test
	$(MAKE) $(TEST_BINS) $(BINS) $(CUDA_LIB) $(FUZZ_REPLAY) $(BUILD)/tests/fuzz_seeds
	@sh tests/run_all.sh $(TEST_BINS)
	@$(BUILD)/tests/fuzz_seeds $(BUILD)/tests/fuzz_seeds_out models/*.cfg > /dev/null
	@for t in $(FUZZ_TARGETS); do \
	    $(BUILD)/tests/fuzz_replay_$$t $(BUILD)/tests/fuzz_seeds_out/$$t tests/fuzz/regress/$$t || exit 1; done

# Fuzzing (tests/fuzz/, README "Fuzzing"): each target under libFuzzer with ASan and UBSan
# (clang) for FUZZ_SECONDS; a crash fails and names its reproducer. `make test` runs the
# same targets over their seeds and tests/fuzz/regress/ (the crashes found before).
FUZZ_TARGETS := cfg safetensors idx image rename predict
FUZZ_SECONDS ?= 60
FUZZ_CC      ?= clang
FUZZ_BUILD   := build/fuzz
FUZZ_FLAGS   := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
                -fno-sanitize-recover=undefined -std=c11 -ffp-contract=off -D_GNU_SOURCE -fopenmp -Wno-pass-failed \
                -I/usr/include/$(MULTIARCH)/openblas-pthread
FUZZ_LIB_OBJ := $(LIB_SRC:%.c=$(FUZZ_BUILD)/%.o) $(CLI_SRC:%.c=$(FUZZ_BUILD)/%.o) \
                $(CPU_SETS:%=$(FUZZ_BUILD)/nn/cpu_kernels_%.o)
FUZZ_REPLAY  := $(FUZZ_TARGETS:%=$(BUILD)/tests/fuzz_replay_%)
.SECONDARY: $(FUZZ_LIB_OBJ) $(patsubst %,$(FUZZ_BUILD)/tests/fuzz/%.o,$(FUZZ_TARGETS) fuzz_util stb_image_impl) \
            $(patsubst %,$(BUILD)/tests/fuzz/%.o,$(FUZZ_TARGETS) fuzz_util replay seeds)
$(FUZZ_BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
$(FUZZ_BUILD)/nn/cpu_kernels.o: FUZZ_FLAGS += -DCPU_KERNEL_SET=cpu_kernels_portable -Wno-psabi
$(FUZZ_BUILD)/nn/cpu_kernels_avx2.o: nn/cpu_kernels.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(AVX2_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
# stb_image reads an empty PNG IDAT chunk into its NULL buffer (stb_image.h 5130,
# `z->idata + ioff`, then memcpy(NULL, p, 0)): harmless, and not ours to change; clang's
# pointer-overflow and nonnull-attribute checks would stop every run there
# (tests/fuzz/regress/image/empty-idat.png). Our own code keeps every check.
$(FUZZ_BUILD)/tests/fuzz/stb_image_impl.o: FUZZ_FLAGS += -fno-sanitize=pointer-overflow,nonnull-attribute
$(FUZZ_BUILD)/fuzz_%: $(FUZZ_BUILD)/tests/fuzz/%.o $(FUZZ_BUILD)/tests/fuzz/fuzz_util.o \
                      $(FUZZ_BUILD)/tests/fuzz/stb_image_impl.o $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer $^ -o $@ -lopenblas -ljpeg -lz -lm -lpthread -ldl
$(BUILD)/tests/fuzz_replay_%: $(BUILD)/tests/fuzz/%.o $(BUILD)/tests/fuzz/fuzz_util.o $(BUILD)/tests/fuzz/replay.o $(CLI_OBJ) $(BUILD)/libcnn.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/fuzz_seeds: $(BUILD)/tests/fuzz/seeds.o $(BUILD)/tests/fuzz/fuzz_util.o $(BUILD)/libcnn.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
deps-fuzz:
	@$(INSTALL_PACKAGES) $(DEPS_BUILD) clang libomp-dev
fuzz: deps-fuzz
	$(MAKE) $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%) $(BUILD)/tests/fuzz_seeds
	@sh tests/fuzz/run.sh $(FUZZ_SECONDS) $(BUILD)/tests/fuzz_seeds $(FUZZ_TARGETS)

# The GPU suite (tests/test_gpu.c) on a machine with an NVIDIA GPU: every kernel and a
# training step against the CPU. Fails where `make test` would skip it (no CUDA, no GPU).
test-gpu: deps-test
	@[ "$(CUDA)" = 1 ] || { echo "make test-gpu: this build has no CUDA (CUDA=0, or no nvcc found): install the CUDA toolkit, or give NVCC=/path/to/nvcc" >&2; exit 1; }
	$(MAKE) $(BUILD)/tests/test_gpu $(CUDA_LIB)
	$(BUILD)/tests/test_gpu --require-gpu

# The same suite against gpu/cuda_kernels.cu's kernels replayed on the host (nvcc, no GPU):
# index arithmetic, summation orders, fp16 bits, the GEMM operand mapping.
REPLAY_CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
$(BUILD)/gpu/replay/host_replay.o: gpu/replay/host_replay.cu gpu/cuda_kernels.cu
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -std=c++17 -MMD -MP -I/usr/include/$(MULTIARCH)/openblas-pthread -c $< -o $@
$(BUILD)/tests/test_gpu_replay: $(BUILD)/tests/test_gpu.o $(BUILD)/tests/testutil.o $(BUILD)/gpu/replay/host_replay.o $(BUILD)/libcnn.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS) -L$(REPLAY_CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++ -lcmocka
# Twice: the second time as on a CPU with AVX2 alone (CNN_CPU_KERNELS=avx2), so on a CPU
# with AVX-512 both widths of the CPU's loops meet the GPU's bits.
test-gpu-replay: deps-test
	@[ -n "$(NVCC)" ] || { echo "make test-gpu-replay: no nvcc found; install the CUDA toolkit" >&2; exit 1; }
	$(MAKE) $(BUILD)/tests/test_gpu_replay
	$(BUILD)/tests/test_gpu_replay
	CNN_CPU_KERNELS=avx2 $(BUILD)/tests/test_gpu_replay

# The build on other CPUs, under emulation (tests/arch.sh): the x86-64 baseline under
# qemu-x86_64 -cpu Nehalem (no AVX), the same binaries under -cpu Haswell (AVX2 without
# AVX-512), and an arm64 cross build (build/aarch64) under qemu-aarch64. EPOCH=0 leaves out
# the emulated epoch of mnist.cfg (some 20 minutes).
ARCH_SUITES := cfg safetensors checkpoint data budget gemm layers fp16 quant optim net loader folder jpeg_eighth
CROSS_ARM64 := CC=aarch64-linux-gnu-gcc BUILD=build/aarch64 BIN_DIR=build/aarch64/ MPI=0 CUDA=0
deps-arch:
	@sh data/install_cross.sh
test-arch: deps deps-test deps-arch
	$(MAKE) data $(BINS) $(ARCH_SUITES:%=$(BUILD)/tests/test_%)
	$(MAKE) $(CROSS_ARM64) build/aarch64/train $(ARCH_SUITES:%=build/aarch64/tests/test_%)
	SUITES="$(ARCH_SUITES)" sh tests/arch.sh

# The .deb files that gpu/run.sh builds from on the GPU machine, into gpu/debs/ (ignored).
gpu-debs:
	sh gpu/fetch_debs.sh gpu/debs

bench: deps-bench
	$(MAKE) all $(BUILD)/bench/sgemm $(BUILD)/bench/make_folders $(BUILD)/bench/depthwise
	sh bench/run.sh
	sh bench/resnet_bench.sh

# The depthwise convolution's bytes/s against the machine's memory bandwidth (bench/depthwise.c).
bench-depthwise: $(BUILD)/bench/depthwise
	$(BUILD)/bench/depthwise $(or $(THREADS),2)

clean:
	rm -rf build $(BINS) libcnn_cuda.so

-include $(shell find build -name '*.d' 2>/dev/null)
