// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Umbrella header: the core (layouts, partitions, plans, the host executor, redistribute,
///        q, k, v by name, the in-process group, the host pipeline), the decode exchange and the
///        Ulysses x Ring primitives: everything that needs no CUDA and no MPI.
///
/// Included separately: `comm/mpi.hpp` and `ring/mpi_mesh.hpp` (need <mpi.h>), the `.cuh` headers (need nvcc), the
/// cost model and its clients (`tune/cost.hpp`, `tune/fit.hpp`, `tune/advise.hpp`) and the libtorch
/// client (`torch/torch.hpp`).
#pragma once

#include "version.hpp"
#include "error.hpp"
#include "layout/layout.hpp"
#include "partition/heads.hpp"
#include "partition/documents.hpp"
#include "layout/element.hpp"
#include "layout/blocks.hpp"
#include "layout/transform.hpp"
#include "layout/rope.hpp"
#include "layout/fp8.hpp"
#include "host/executor.hpp"
#include "topology/nodes.hpp"
#include "topology/route.hpp"
#include "plan/plan.hpp"
#include "transport/dispatch.hpp"
#include "plan/attention.hpp"
#include "plan/window_bytes.hpp"
#include "topology/mesh.hpp"
#include "redistribute.hpp"
#include "attention_call.hpp"
#include "split_phase.hpp"
#include "bands.hpp"
#include "allgather.hpp"
#include "comm/local.hpp"
#include "comm/local_mesh.hpp"
#include "host/pipeline.hpp"
// Decode: the exchange of partial attention outputs merged by their LSE (decode/, merge/).
#include "merge/lse.hpp"
#include "decode/plan.hpp"
#include "decode/host.hpp"
#include "decode/exchange.hpp"
// Ulysses x Ring: the 2-D sequence partition, RingPlan, the ring schedule, rotation and merge (ring/).
#include "partition/ring.hpp"
#include "ring/plan.hpp"
#include "ring/buffers.hpp"
#include "ring/schedule.hpp"
#include "ring/merge.hpp"
#include "ring/rotation.hpp"
#include "ring/agreement.hpp"
