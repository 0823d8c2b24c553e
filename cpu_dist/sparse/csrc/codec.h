// How rows cross the wire: the one definition of the row encodings that proto/ps.proto's
// `Compression` names (the numpy twin is cpu_dist/sparse/tests/test_compression.py, held
// equal to this bit for bit).  Bytes per row of dim D:
//
//   kNone : float32[D], little-endian                                           4 D
//   kFp16 : float32 scale, then IEEE binary16 h[D]                              4 + 2 D
//           scale = 2^e, the power of two that puts max_c |x_c| / scale in [2^14, 2^15),
//                   e >= -126 (1 for a zero row)
//           h_c   = binary16(x_c / scale), rounded to nearest, ties to even
//           x'_c  = float32(h_c) * scale (exact)
//   kInt8 : float32 scale, then int8 q[D]                                       4 + D
//           scale = max_c |x_c| / 127 (one float32 division; 0 for a zero row)
//           q_c   = rint(double(x_c) / double(scale)) (ties to even), in -127..127
//           x'_c  = float32(q_c) * scale (one float32 multiplication)
//
// int8 is symmetric (no zero point), which keeps a pull of D = 64 with its keys at
// (8 + 4 + 64) / (8 + 256) = 0.288 of float32's bytes.  Its error is |x_c - x'_c| <= scale / 2
// (plus the rounding of the product) while the scale is a normal float (max |x| >= 127 *
// 2^-126); below that the error is under 2^-140.  fp16's is 2^-11 relative for |x| >=
// 2^-14 * scale (normal halves; max |x| / 2^28 and up) and 2^-25 * scale absolute below.  The
// scale is what makes fp16 usable for gradients: embedding gradients sit mostly around
// 1e-7..1e-5, where plain binary16 is subnormal and loses most of its bits.
//
// Nothing is clamped or made infinite: an encoder refuses a value its encoding cannot carry
// (non-finite in every mode; |x| >= 2^127 in fp16, whose scale would pass 2^112; in int8 a
// row whose 127 * scale overflows float32, max |x| within 2^-24 of FLT_MAX), and a decoder
// refuses what no encoder writes (a non-finite fp16 value, an fp16 scale that is no power of
// two in [2^-126, 2^112], an int8 scale that is negative or with 127 * scale not finite,
// q = -128), so decoded rows are always finite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cpu_dist::ps {

enum class Encoding : uint8_t { kNone = 0, kFp16 = 1, kInt8 = 2 };

// "none", "fp16", "int8" (the client's `compression` keyword).
std::optional<Encoding> encoding_from_name(std::string_view name);
const char* encoding_name(Encoding e);
// proto Compression value -> Encoding; nullopt for a value this build does not know.
std::optional<Encoding> encoding_from_wire(int compression);
int encoding_to_wire(Encoding e);

size_t encoded_row_bytes(Encoding e, uint32_t dim);
// One row's bytes as messages spell them: "dim 8 x 4", "(4 + dim 8 x 2) as fp16", "(4 + dim 8) as
// int8".
std::string row_bytes_text(Encoding e, uint32_t dim);

// Why a row could not be encoded or decoded.
struct CodecError {
  enum Kind : uint8_t { kNonFinite, kRange, kBadScale, kBadInt8 };
  Kind kind = kNonFinite;
  uint32_t column = 0;  // of the value (not used for kBadScale)
  float value = 0.0f;   // the value, scale, or int8 byte refused
};
// "column 3 is inf: not finite", "int8 scale is -1: ...", ...
std::string describe(Encoding e, const CodecError& err);

// Encodes one row of dim floats into out (encoded_row_bytes, any alignment).  False when
// the row holds a value the encoding cannot carry (*err says which); out is then partly
// written.
bool encode_row(Encoding e, const float* row, uint32_t dim, void* out, CodecError* err);
// Decodes one encoded row (any alignment) into out (dim floats, any alignment).  False when
// no encoder writes such a row (*err says why).
bool decode_row(Encoding e, const void* in, uint32_t dim, void* out, CodecError* err);
// The same for n rows in a row (rows[n][dim] contiguous); *bad_row is the row refused.
bool encode_rows(Encoding e, const float* rows, size_t n, uint32_t dim, void* out, size_t* bad_row,
                 CodecError* err);
bool decode_rows(Encoding e, const void* in, size_t n, uint32_t dim, void* out, size_t* bad_row,
                 CodecError* err);

// IEEE binary16 conversions (exposed for the tests and the benchmarks).
uint16_t half_from_float(float f);  // f finite with |f| < 65520; ties to even
float float_from_half(uint16_t h);  // exact

}  // namespace cpu_dist::ps
