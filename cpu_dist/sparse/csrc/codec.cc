#include "codec.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ps.pb.h"

namespace cpu_dist::ps {

static_assert(static_cast<int>(Encoding::kNone) == COMPRESSION_NONE);
static_assert(static_cast<int>(Encoding::kFp16) == COMPRESSION_FP16);
static_assert(static_cast<int>(Encoding::kInt8) == COMPRESSION_INT8);

namespace {

// |x| bits from which the scaled fp16 encoding cannot carry x: 2^127 (the scale would exceed
// 2^112, and a decoded value could round to infinity), infinities and NaNs.
constexpr uint32_t kFp16LimitBits = 0x7f000000u;
constexpr uint32_t kExponentBits = 0x7f800000u;

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

bool finite_bits(uint32_t b) { return (b & kExponentBits) != kExponentBits; }

// binary16 bits of the float with bits x (|x| < 65520), without branches so that row loops
// vectorize.  Both roundings are computed and one is kept:
// - |x| < 2^-14, a subnormal half (or zero), counted in units of 2^-24: 0.5f + |x| keeps
//   exactly those units in its mantissa (its ulp is 2^-24), rounded to nearest, ties to even
//   by the float addition itself; up to 1024 units, i.e. 0x0400, the smallest normal half;
// - otherwise a normal half: the exponent rebiased (127 -> 15) and 13 mantissa bits dropped,
//   rounding to nearest, ties to even; a carry out of the mantissa raises the exponent.
uint16_t half_bits(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  const uint32_t sub = bits_of(float_of(a) + 0.5f) - 0x3f000000u;
  const uint32_t rebased = a - (112u << 23);
  const uint32_t normal = (rebased + 0x0fffu + ((rebased >> 13) & 1u)) >> 13;
  const uint32_t is_sub = 0u - static_cast<uint32_t>(a < 0x38800000u);  // a mask, not a branch
  return static_cast<uint16_t>(sign | (sub & is_sub) | (normal & ~is_sub));
}

// The float of finite binary16 bits h, exactly and without branches: a normal half's
// exponent rebiased (15 -> 127) and mantissa widened; a subnormal half's mantissa times 2^-24
// (an integer conversion and an exact product, so no subnormal float is ever read: the
// result holds even on a thread that treats subnormal inputs as zero).
float half_value(uint16_t h) {
  const uint32_t magnitude = h & 0x7fffu;
  const uint32_t normal = (magnitude << 13) + (112u << 23);
  const uint32_t sub = bits_of(static_cast<float>(static_cast<int32_t>(h & 0x3ffu)) * 0x1p-24f);
  const uint32_t is_sub = 0u - static_cast<uint32_t>(magnitude < 0x0400u);
  return float_of((static_cast<uint32_t>(h & 0x8000u) << 16) | (sub & is_sub) | (normal & ~is_sub));
}

// Rows are converted through stack blocks of this many values, so that the loops vectorize
// whatever the alignment of the wire buffer.
constexpr uint32_t kBlock = 256;

// The int8 scale of a row whose max |x| is m (finite): max / 127; false when 127 * scale
// overflows (a decoded value could be infinite).
bool int8_scale(float m, float* scale) {
  *scale = m / 127.0f;
  return std::isfinite(127.0f * *scale);
}

bool encode_int8(const float* x, uint32_t dim, uint8_t* out, CodecError* err) {
  // max |x| on the bits: for non-negative floats (NaNs excluded below) the integer order is
  // the float order, and an integer maximum vectorizes where a float one may not.
  uint32_t m_bits = 0;
  uint32_t bad = 0;
  for (uint32_t c = 0; c < dim; ++c) {
    const uint32_t a = bits_of(x[c]) & 0x7fffffffu;
    bad |= !finite_bits(a);
    m_bits = a > m_bits ? a : m_bits;
  }
  if (bad != 0) {
    for (uint32_t c = 0; c < dim; ++c)
      if (!finite_bits(bits_of(x[c]))) {
        *err = CodecError{CodecError::kNonFinite, c, x[c]};
        return false;
      }
  }
  const float m = float_of(m_bits);
  float scale;
  if (!int8_scale(m, &scale)) {
    uint32_t c = 0;
    while (c + 1 < dim && std::fabs(x[c]) != m) ++c;
    *err = CodecError{CodecError::kRange, c, x[c]};
    return false;
  }
  std::memcpy(out, &scale, sizeof(scale));
  int8_t* q = reinterpret_cast<int8_t*>(out + sizeof(scale));
  if (scale == 0.0f) {
    std::memset(q, 0, dim);
    return true;
  }
  // Rounded in float64 to the nearest integer, ties to even: adding and removing 1.5 * 2^52
  // leaves no fraction bits (exact for |y| < 2^51; here |y| <= 127 up to the rounding of
  // the scale, or a little more for a subnormal scale, hence the clamp).
  constexpr double kRound = 6755399441055744.0;
  const double s = scale;
  for (uint32_t c = 0; c < dim; ++c) {
    double y = (static_cast<double>(x[c]) / s + kRound) - kRound;
    y = y > 127.0 ? 127.0 : (y < -127.0 ? -127.0 : y);
    q[c] = static_cast<int8_t>(y);
  }
  return true;
}

bool decode_int8(const uint8_t* in, uint32_t dim, uint8_t* out, CodecError* err) {
  float scale;
  std::memcpy(&scale, in, sizeof(scale));
  if (!(scale >= 0.0f) || !std::isfinite(127.0f * scale)) {
    *err = CodecError{CodecError::kBadScale, 0, scale};
    return false;
  }
  const int8_t* q = reinterpret_cast<const int8_t*>(in + sizeof(scale));
  uint32_t bad = 0;
  for (uint32_t c = 0; c < dim; ++c) {
    bad |= q[c] == -128;
    const float v = static_cast<float>(q[c]) * scale;
    std::memcpy(out + size_t{c} * sizeof(v), &v, sizeof(v));
  }
  if (bad != 0) {
    for (uint32_t c = 0; c < dim; ++c)
      if (q[c] == -128) {
        *err = CodecError{CodecError::kBadInt8, c, -128.0f};
        return false;
      }
  }
  return true;
}

// The fp16 scale of a row whose max |x| has bits m_bits (finite, below 2^127): the power of
// two 2^e that puts max |x| / 2^e in [2^14, 2^15), so the row's largest values keep fp16's
// full 11 bits whatever their magnitude (embedding gradients are mostly below fp16's
// smallest normal, 2^-14), with e >= -126 so that no scale is a subnormal float; 1 for a
// zero row.  Dividing by a power of two is exact, so only the rounding to fp16 loses bits.
float fp16_scale(uint32_t m_bits) {
  if (m_bits == 0) return 1.0f;
  const int exponent = static_cast<int>(m_bits >> 23) - 127;  // of max |x| (-127: subnormal)
  const int e = std::max(exponent - 14, -126);
  return float_of(static_cast<uint32_t>(e + 127) << 23);
}

// A scale as fp16_scale writes it: a power of two in [2^-126, 2^112].
bool fp16_scale_ok(float scale) {
  const uint32_t b = bits_of(scale);
  return (b & 0x807fffffu) == 0 && (b >> 23) >= 1 && (b >> 23) <= 112 + 127;
}

bool encode_fp16(const float* x, uint32_t dim, uint8_t* out, CodecError* err) {
  uint32_t m_bits = 0;
  for (uint32_t c = 0; c < dim; ++c) {
    const uint32_t a = bits_of(x[c]) & 0x7fffffffu;
    m_bits = a > m_bits ? a : m_bits;
  }
  if (m_bits >= kFp16LimitBits) {  // a non-finite value, or |x| >= 2^127
    for (uint32_t c = 0; c < dim; ++c)
      if ((bits_of(x[c]) & 0x7fffffffu) >= kFp16LimitBits) {
        const bool finite = finite_bits(bits_of(x[c]));
        *err = CodecError{finite ? CodecError::kRange : CodecError::kNonFinite, c, x[c]};
        return false;
      }
  }
  const float scale = fp16_scale(m_bits);
  std::memcpy(out, &scale, sizeof(scale));
  out += sizeof(scale);
  const float inverse = 1.0f / scale;  // a power of two in [2^-112, 2^126]: exact
  uint16_t h[kBlock];
  for (uint32_t b = 0; b < dim; b += kBlock) {
    const uint32_t m = std::min(kBlock, dim - b);
    for (uint32_t c = 0; c < m; ++c) h[c] = half_bits(bits_of(x[b + c] * inverse));
    std::memcpy(out + size_t{b} * 2, h, size_t{m} * 2);
  }
  return true;
}

bool decode_fp16(const uint8_t* in, uint32_t dim, uint8_t* out, CodecError* err) {
  float scale;
  std::memcpy(&scale, in, sizeof(scale));
  if (!fp16_scale_ok(scale)) {
    *err = CodecError{CodecError::kBadScale, 0, scale};
    return false;
  }
  in += sizeof(scale);
  uint16_t h[kBlock];
  float v[kBlock];
  for (uint32_t b = 0; b < dim; b += kBlock) {
    const uint32_t m = std::min(kBlock, dim - b);
    std::memcpy(h, in + size_t{b} * 2, size_t{m} * 2);
    uint32_t bad = 0;
    for (uint32_t c = 0; c < m; ++c) {
      bad |= (h[c] & 0x7c00u) == 0x7c00u;
      v[c] = half_value(h[c]) * scale;  // |half| < 2^16 and scale <= 2^112: finite, exact
    }
    if (bad != 0) {
      for (uint32_t c = 0; c < m; ++c)
        if ((h[c] & 0x7c00u) == 0x7c00u) {
          *err = CodecError{CodecError::kNonFinite, b + c, float_from_half(h[c])};
          return false;
        }
    }
    std::memcpy(out + size_t{b} * sizeof(float), v, size_t{m} * sizeof(float));
  }
  return true;
}

}  // namespace

// ---- names ----------------------------------------------------------------------------------

std::optional<Encoding> encoding_from_name(std::string_view name) {
  if (name == "none") return Encoding::kNone;
  if (name == "fp16") return Encoding::kFp16;
  if (name == "int8") return Encoding::kInt8;
  return std::nullopt;
}

const char* encoding_name(Encoding e) {
  switch (e) {
    case Encoding::kNone: return "none";
    case Encoding::kFp16: return "fp16";
    case Encoding::kInt8: return "int8";
  }
  return "unknown";
}

std::optional<Encoding> encoding_from_wire(int compression) {
  switch (compression) {
    case COMPRESSION_NONE: return Encoding::kNone;
    case COMPRESSION_FP16: return Encoding::kFp16;
    case COMPRESSION_INT8: return Encoding::kInt8;
    default: return std::nullopt;
  }
}

int encoding_to_wire(Encoding e) { return static_cast<int>(e); }

size_t encoded_row_bytes(Encoding e, uint32_t dim) {
  switch (e) {
    case Encoding::kNone: return size_t{dim} * sizeof(float);
    case Encoding::kFp16: return sizeof(float) + size_t{dim} * sizeof(uint16_t);
    case Encoding::kInt8: return sizeof(float) + dim;
  }
  return 0;
}

std::string row_bytes_text(Encoding e, uint32_t dim) {
  switch (e) {
    case Encoding::kNone: return absl::StrCat("dim ", dim, " x 4");
    case Encoding::kFp16: return absl::StrCat("(4 + dim ", dim, " x 2) as fp16");
    case Encoding::kInt8: return absl::StrCat("(4 + dim ", dim, ") as int8");
  }
  return "?";
}

std::string describe(Encoding e, const CodecError& err) {
  switch (err.kind) {
    case CodecError::kNonFinite:
      return absl::StrCat("column ", err.column, " is ", err.value, ": not finite");
    case CodecError::kRange:
      return absl::StrCat("column ", err.column, " is ", err.value, ": beyond ", encoding_name(e),
                          e == Encoding::kFp16 ? "'s range (|x| < 2^127)"
                                               : "'s range (127 * scale overflows float32)");
    case CodecError::kBadScale:
      if (e == Encoding::kFp16)
        return absl::StrCat("fp16 scale is ", err.value,
                            ": must be a power of two in [2^-126, 2^112]");
      return absl::StrCat("int8 scale is ", err.value,
                          ": must be >= 0 with 127 * scale finite in float32");
    case CodecError::kBadInt8:
      return absl::StrCat("column ", err.column, " is -128: int8 values are in -127..127");
  }
  return "unknown codec error";
}

// ---- binary16 -------------------------------------------------------------------------------

uint16_t half_from_float(float f) { return half_bits(bits_of(f)); }

float float_from_half(uint16_t h) {
  if ((h & 0x7c00u) != 0x7c00u) return half_value(h);
  // Infinities and NaNs (the payload kept): only for messages, no decoder returns them.
  return float_of((static_cast<uint32_t>(h & 0x8000u) << 16) | kExponentBits |
                  (static_cast<uint32_t>(h & 0x3ffu) << 13));
}

// ---- rows ---------------------------------------------------------------------------------

bool encode_row(Encoding e, const float* x, uint32_t dim, void* out, CodecError* err) {
  uint8_t* o = static_cast<uint8_t*>(out);
  switch (e) {
    case Encoding::kNone:
      for (uint32_t c = 0; c < dim; ++c)
        if (!finite_bits(bits_of(x[c]))) {
          *err = CodecError{CodecError::kNonFinite, c, x[c]};
          return false;
        }
      std::memcpy(o, x, size_t{dim} * sizeof(float));
      return true;
    case Encoding::kFp16: return encode_fp16(x, dim, o, err);
    case Encoding::kInt8: return encode_int8(x, dim, o, err);
  }
  return false;
}

bool decode_row(Encoding e, const void* in, uint32_t dim, void* out, CodecError* err) {
  const uint8_t* i = static_cast<const uint8_t*>(in);
  uint8_t* o = static_cast<uint8_t*>(out);
  switch (e) {
    case Encoding::kNone: std::memcpy(o, i, size_t{dim} * sizeof(float)); return true;
    case Encoding::kFp16: return decode_fp16(i, dim, o, err);
    case Encoding::kInt8: return decode_int8(i, dim, o, err);
  }
  return false;
}

bool encode_rows(Encoding e, const float* rows, size_t n, uint32_t dim, void* out, size_t* bad_row,
                 CodecError* err) {
  const size_t row_bytes = encoded_row_bytes(e, dim);
  for (size_t i = 0; i < n; ++i)
    if (!encode_row(e, rows + i * dim, dim, static_cast<uint8_t*>(out) + i * row_bytes, err)) {
      *bad_row = i;
      return false;
    }
  return true;
}

bool decode_rows(Encoding e, const void* in, size_t n, uint32_t dim, void* out, size_t* bad_row,
                 CodecError* err) {
  const size_t in_bytes = encoded_row_bytes(e, dim), out_bytes = size_t{dim} * sizeof(float);
  for (size_t i = 0; i < n; ++i)
    if (!decode_row(e, static_cast<const uint8_t*>(in) + i * in_bytes, dim,
                    static_cast<uint8_t*>(out) + i * out_bytes, err)) {
      *bad_row = i;
      return false;
    }
  return true;
}

}  // namespace cpu_dist::ps
