// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Umbrella header: everything that needs no CUDA and no MPI.
///
/// `comm/mpi.hpp` (needs <mpi.h>) and the `.cuh` headers (need nvcc) are included separately.
#pragma once

#include "version.hpp"
#include "error.hpp"
#include "layout/layout.hpp"
#include "partition/heads.hpp"
#include "layout/element.hpp"
#include "layout/blocks.hpp"
#include "host/executor.hpp"
#include "topology/nodes.hpp"
#include "topology/route.hpp"
#include "plan/plan.hpp"
#include "plan/attention.hpp"
#include "topology/mesh.hpp"
#include "tune/cost.hpp"
#include "redistribute.hpp"
#include "comm/local.hpp"
#include "host/pipeline.hpp"
