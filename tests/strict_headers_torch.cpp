// SPDX-License-Identifier: Apache-2.0
// torch.hpp under an engine's strict flags (as strict_headers.cpp for the other headers): the
// libtorch client's templates instantiated over ProcessGroupComm; compiled, not run (test_torch
// runs them). libtorch's own headers come in as system headers.
#include <ulysses/torch/torch.hpp>

namespace ulysses {
template std::vector<at::Tensor> seq_to_head_autograd<ProcessGroupComm>(const Plan&, ProcessGroupComm&, const std::vector<at::Tensor>&);
template std::vector<at::Tensor> head_to_seq_autograd<ProcessGroupComm>(const Plan&, ProcessGroupComm&, const std::vector<at::Tensor>&);
template void redistribute<ProcessGroupComm, HostExecutor>(const Plan&, Direction, ProcessGroupComm&, HostExecutor&,
                                                           const std::vector<at::Tensor>&, const std::vector<at::Tensor>&, at::Tensor);
template void check_agreement<ProcessGroupComm>(const Plan&, ProcessGroupComm&);
}  // namespace ulysses

int main() { return 0; }
