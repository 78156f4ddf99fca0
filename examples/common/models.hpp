// SPDX-License-Identifier: Apache-2.0
// Attention shapes of public models (from their published configurations), as in the project's
// shared case list models.json. Used by the demo's --model flag and by the models tests.
#pragma once

#include <cctype>
#include <cstdint>
#include <string>

namespace ulysses_models {

struct Model {
  const char* name;
  std::int64_t num_heads;     ///< H, query heads
  std::int64_t num_kv_heads;  ///< Hkv (== H: plain multi-head attention)
  std::int64_t head_dim;      ///< D of q and k
  std::int64_t v_head_dim;    ///< D of v (differs from head_dim under MLA)
  std::int64_t typical_seq_len;
};

inline constexpr Model kModels[] = {
    {"GPT-2 small", 12, 12, 64, 64, 1024},
    {"Llama-3.1-8B", 32, 8, 128, 128, 131072},
    {"Llama-3.1-70B", 64, 8, 128, 128, 131072},
    {"Llama-3.1-405B", 128, 8, 128, 128, 131072},
    {"Mistral-7B", 32, 8, 128, 128, 32768},
    {"Qwen2.5-7B", 28, 4, 128, 128, 131072},
    {"Qwen2.5-14B", 40, 8, 128, 128, 131072},
    {"Qwen2.5-72B", 64, 8, 128, 128, 131072},
    {"Gemma-2-9B", 16, 8, 256, 256, 8192},
    {"Phi-3-mini", 32, 32, 96, 96, 131072},
    {"Falcon-7B", 71, 1, 64, 64, 2048},
    {"DeepSeek-V3 (MLA)", 128, 128, 192, 128, 131072},
    {"FLUX.1-dev", 24, 24, 128, 128, 4608},
    {"HunyuanVideo", 24, 24, 128, 128, 119056},
    {"Wan2.1-14B", 40, 40, 128, 128, 75600},
    {"CogVideoX-5B", 48, 48, 64, 64, 17776},
};

/// The model named `name`, ignoring case and punctuation ("llama3.18b" finds "Llama-3.1-8B"), or
/// else the only model whose name starts with it ("gpt-2" finds "GPT-2 small"); nullptr if none
/// or several match.
inline const Model* find_model(const std::string& name) {
  auto norm = [](const std::string& s) {
    std::string o;
    for (char c : s)
      if (std::isalnum(static_cast<unsigned char>(c))) o += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return o;
  };
  const std::string want = norm(name);
  const Model* prefix = nullptr;
  int prefixes = 0;
  for (const Model& m : kModels) {
    const std::string n = norm(m.name);
    if (n == want) return &m;
    if (!want.empty() && n.compare(0, want.size(), want) == 0) prefix = &m, ++prefixes;
  }
  return prefixes == 1 ? prefix : nullptr;
}

}  // namespace ulysses_models
