#include "common/operands.h"

#include <cmath>
#include <cstring>
#include <random>

namespace mc2::test {

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

Mat Random(size_t count, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> f(count);
  for (auto& x : f) x = dist(rng);
  Mat m;
  m.value.resize(count);
  if (dtype == DType::kF32) {
    m.bytes.resize(count * 4);
    if (count) std::memcpy(m.bytes.data(), f.data(), count * 4);
    for (size_t i = 0; i < count; ++i) m.value[i] = f[i];
  } else {
    std::vector<bf16> h(count);
    ConvertF32ToBF16(f.data(), h.data(), count);
    std::vector<float> back(count);
    ConvertBF16ToF32(h.data(), back.data(), count);
    m.bytes.resize(count * 2);
    if (count) std::memcpy(m.bytes.data(), h.data(), count * 2);
    for (size_t i = 0; i < count; ++i) m.value[i] = back[i];
  }
  return m;
}

bool Close(float c, double ref, double abs_sum) {
  return std::fabs(double(c) - ref) <= 1e-5 * abs_sum + 1e-6;
}

std::vector<FusedOptions> AllPipelines() {
  std::vector<FusedOptions> v;
  FusedOptions o;
  o.pipeline = Pipeline::kSerial;
  v.push_back(o);
  o.pipeline = Pipeline::kAuto;
  v.push_back(o);
  for (int s : {1, 2, 3, 4, 7, 16}) {
    o.pipeline = Pipeline::kChunked;
    o.splits = s;
    v.push_back(o);
    o.pipeline = Pipeline::kFused;
    v.push_back(o);
  }
  return v;
}

}  // namespace mc2::test
