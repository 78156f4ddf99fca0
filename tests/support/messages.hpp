// SPDX-License-Identifier: Apache-2.0
// The message pattern the exchange_messages() tests of every communicator share: rank i sends
// each other rank j two messages, (i + j + 1) bytes of 16*i + j, then 1 byte of 0xF0 + i, and
// receives j's two messages into buffers of the same sizes.
#pragma once

#include <ulysses/host/executor.hpp>

#include <cstddef>
#include <vector>

namespace ut {

struct MessagePattern {
  std::vector<std::vector<std::byte>> sbuf, rbuf;  // one buffer per message, peers in rank order
  std::vector<ulysses::Message> send, recv;

  MessagePattern(int P, int i) {
    for (int j = 0; j < P; ++j) {
      if (j == i) continue;
      sbuf.emplace_back(static_cast<std::size_t>(i + j + 1), std::byte(16 * i + j));
      sbuf.emplace_back(1, std::byte(0xF0 + i));
      rbuf.emplace_back(static_cast<std::size_t>(i + j + 1));
      rbuf.emplace_back(1);
      for (int k = 0; k < 2; ++k) peer.push_back(j);
    }
    for (std::size_t k = 0; k < sbuf.size(); ++k) {
      send.push_back({peer[k], sbuf[k].data(), sbuf[k].size()});
      recv.push_back({peer[k], rbuf[k].data(), rbuf[k].size()});
    }
  }
  std::vector<int> peer;  // peer of message k
};

}  // namespace ut
