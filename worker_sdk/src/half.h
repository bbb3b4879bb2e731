// IEEE 754 binary16 (float16) and bfloat16 to and from float32, on plain bit patterns (no
// compiler extensions): collectives on 16-bit floats reduce in float32 and round back to
// nearest, ties to even. NaN stays NaN; overflow becomes infinity.
#pragma once

#include <cstdint>
#include <cstring>

namespace crun::worker {

inline std::uint32_t Bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float FromBits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float BFloat16ToFloat(std::uint16_t b) { return FromBits(std::uint32_t{b} << 16); }

inline std::uint16_t FloatToBFloat16(float f) {
  const std::uint32_t u = Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

inline float HalfToFloat(std::uint16_t h) {
  const std::uint32_t sign = (std::uint32_t{h} & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return FromBits(sign | 0x7f800000u | (mant << 13));  // inf or NaN
  return FromBits(sign | ((exp + 112) << 23) | (mant << 13));
}

inline std::uint16_t FloatToHalf(float f) {
  const std::uint32_t u = Bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow: inf
  if (abs < 0x38800000u) {  // below the smallest normal half: a subnormal or zero
    // Scale into the subnormal range with float arithmetic, which rounds to nearest even.
    const float scaled = FromBits(abs) * 16777216.0f;  // * 2^24: units of the smallest subnormal
    const auto m = static_cast<std::uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    std::uint32_t r = m;
    if (rest > 0.5f || (rest == 0.5f && (m & 1u) != 0)) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  // Normal: rebias the exponent, round the mantissa to 10 bits (nearest, ties to even).
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rebased + rounding) >> 13));
}

}  // namespace crun::worker
