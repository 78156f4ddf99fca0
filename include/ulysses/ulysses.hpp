// SPDX-License-Identifier: Apache-2.0
/// @file ulysses.hpp
/// @brief Umbrella header: everything that needs no CUDA and no MPI.
///
/// `comm/mpi.hpp` (needs <mpi.h>) and the `.cuh` headers (need nvcc) are included separately.
#pragma once

#include "version.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "partition.hpp"
#include "element.hpp"
#include "block.hpp"
#include "copy.hpp"
#include "topology.hpp"
#include "plan.hpp"
#include "attention.hpp"
#include "mesh.hpp"
#include "cost.hpp"
#include "redistribute.hpp"
#include "comm/local.hpp"
#include "pipeline.hpp"
