// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief CUDA's 16-bit floating-point types as ulysses element types: element_type_of<__half> is
///        float16 and element_type_of<__nv_bfloat16> is bfloat16 (TensorSpec::of<__half>, sums of
///        replicated heads in backward passes).
///
/// Specialisations of the one trait of layout/element.hpp, nothing else: the sum rules of those
/// types (SumArith) are there too, written once for the host and the device.
///
/// Needs nvcc (or another CUDA compiler) for cuda_fp16.h and cuda_bf16.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "../layout/element.hpp"

ULYSSES_NAMESPACE_BEGIN
template <>
struct element_type_of<__half> : std::integral_constant<ElementType, ElementType::float16> {};
template <>
struct element_type_of<__nv_bfloat16> : std::integral_constant<ElementType, ElementType::bfloat16> {};
ULYSSES_NAMESPACE_END
