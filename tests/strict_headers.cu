// SPDX-License-Identifier: Apache-2.0
// Every CUDA header under an engine's strict host flags (tests/CMakeLists.txt: nvcc with
// -Xcompiler -Wall,-Wextra,-Wshadow,-Wconversion,-Wsign-conversion; any warning located in our
// headers fails the test, host or device side). Compiled, not run: the entry points are instantiated over the
// CUDA executor with NcclComm, DeviceLocalGroup::Comm and (with MPI) MpiDeviceWindowComm, on every path they take.
#include <ulysses/comm/local_device.cuh>
#include <ulysses/comm/nccl.cuh>
#include <ulysses/cuda/executor.cuh>
#include <ulysses/cuda/pipeline.cuh>
#include <ulysses/ulysses.hpp>
#if defined(ULYSSES_STRICT_MPI)
#include <ulysses/comm/mpi_device_window.cuh>
#endif

namespace ulysses {
template void seq_to_head<NcclComm, CudaExecutor>(const Plan&, NcclComm&, CudaExecutor&, const TensorList<ConstByteSpan>&,
                                                  const TensorList<ByteSpan>&, Workspace);
template void head_to_seq_backward<NcclComm, CudaExecutor>(const Plan&, NcclComm&, CudaExecutor&, const TensorList<ConstByteSpan>&,
                                                           const TensorList<ByteSpan>&, Workspace);
template void seq_to_head<DeviceLocalGroup::Comm, CudaExecutor>(const Plan&, DeviceLocalGroup::Comm&, CudaExecutor&,
                                                                const TensorList<ConstByteSpan>&, const TensorList<ByteSpan>&, Workspace);
template void head_to_seq<DeviceLocalGroup::Comm, CudaExecutor>(const Plan&, DeviceLocalGroup::Comm&, CudaExecutor&,
                                                                const TensorList<ConstByteSpan>&, const TensorList<ByteSpan>&, Workspace);
template void CudaPipeline::redistribute<NcclComm, CudaExecutor>(const Plan&, Direction, NcclComm&, const CudaExecutor&,
                                                        const TensorList<ConstByteSpan>&, const TensorList<ByteSpan>&, Workspace);
template void CudaPipeline::redistribute<DeviceLocalGroup::Comm, CudaExecutor>(const Plan&, Direction, DeviceLocalGroup::Comm&, const CudaExecutor&,
                                                                      const TensorList<ConstByteSpan>&, const TensorList<ByteSpan>&,
                                                                      Workspace);
#if defined(ULYSSES_STRICT_MPI)
template void seq_to_head<MpiDeviceWindowComm, CudaExecutor>(const Plan&, MpiDeviceWindowComm&, CudaExecutor&, const TensorList<ConstByteSpan>&,
                                                             const TensorList<ByteSpan>&, Workspace);
template void head_to_seq<MpiDeviceWindowComm, CudaExecutor>(const Plan&, MpiDeviceWindowComm&, CudaExecutor&, const TensorList<ConstByteSpan>&,
                                                             const TensorList<ByteSpan>&, Workspace);
#endif
}  // namespace ulysses

int main() { return 0; }
