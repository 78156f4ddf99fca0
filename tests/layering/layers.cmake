# SPDX-License-Identifier: Apache-2.0
# The layers of include/ulysses, lowest first (docs/design.md, "Layers"): each entry is a list of
# path regexes separated by '|'. A header may include its own layer and lower ones.
set(ULYSSES_LAYER_NAMES
  "core"        # version, errors, checked arithmetic, the CUDA namespace and error checks
  "layout"      # Layout, ElementType and sums, block copies, buffer indices, Message, the row walk, row transforms (RoPE) and the fp8 codec; the LSE merge
  "partition"   # sequence and head partitions (the ring partition too), node layouts, two-level routes, Mesh; the executors (they run block lists)
  "comm"        # the communicator and executor concepts, ExchangeState, the adapters (no planner) and their mesh splits
  "plan"        # specs and Path, the immutable Plan and its build, the agreement record and check, the peer copy's lists, attention specs; the decode plan and its executors
  "transport"   # one file per transport (the ring's step too: ring_step.hpp), the dispatch and choose_path(); the decode exchange
  "ring"        # Ulysses x Ring: RingPlan, the schedule, the rotation (over transport/ring_step.hpp), the merge, the configuration check, split_ring()
  "facade"      # redistribute / seq_to_head / ..., q, k, v by name, split-phase calls, head bands, the pipelines, the umbrella header
  "attention"   # the drop-in distributed attention: distributed_attention() / _backward() around the engine's kernel
  "clients")    # cost model and advice, the libtorch client
set(ULYSSES_LAYERS
  "version\\.hpp|error\\.hpp|detail/.*|cuda/detail/config\\.cuh"
  "layout/.*|merge/.*"
  "partition/.*|topology/.*|host/executor\\.hpp|host/detail/.*|cuda/policy\\.cuh|cuda/element\\.cuh|cuda/executor\\.cuh|cuda/detail/.*"
  "comm/.*"
  "plan/.*|decode/spec\\.hpp|decode/buffers\\.hpp|decode/detail/.*|decode/plan\\.hpp|decode/agreement\\.hpp|decode/kernels\\.hpp|decode/host\\.hpp|cuda/merge\\.cuh"
  "transport/.*|decode/exchange\\.hpp"
  "ring/.*"
  "redistribute\\.hpp|allgather\\.hpp|attention_call\\.hpp|split_phase\\.hpp|bands\\.hpp|host/pipeline\\.hpp|cuda/pipeline\\.cuh|ulysses\\.hpp"
  "attention/.*"
  "tune/.*|torch/.*")
# The deprecated names of 0.1 (one header, for code that still uses them): no layer may include it.
set(ULYSSES_COMPAT_HEADERS compat/v0_1.hpp)
