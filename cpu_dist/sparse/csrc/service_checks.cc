// PsService's validation: the token, the tables and parts a request names, its keys,
// gradients and their encoding, and the decode budget.  Every check names what it refused
// (the table, the field, the key) and changes nothing: a request is checked whole before any
// table sees it (service.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "finite.h"
#include "service.h"
#include "status_util.h"

namespace cpu_dist::ps {

using grpc::Status;
using grpc::StatusCode;

Status PsService::check_token(const std::string* token) const {
  if (token == nullptr || token->empty())
    return Status(StatusCode::UNAUTHENTICATED,
                  absl::StrCat("missing token (call metadata ", kTokenMetadataKey, ")"));
  // Constant-time in the token's content: no early exit on the first differing byte.
  const std::string& want = opts_.token;
  unsigned diff = token->size() == want.size() ? 0u : 1u;
  for (size_t i = 0; i < want.size(); ++i)
    diff |= static_cast<unsigned char>(want[i]) ^
            static_cast<unsigned char>(i < token->size() ? (*token)[i] : 0);
  if (diff != 0) return Status(StatusCode::UNAUTHENTICATED, "wrong token");
  return Status::OK;
}

Status PsService::find_table(const std::string& name, ShardTable** out) const {
  *out = tables_.find(name);
  if (*out != nullptr) return Status::OK;
  std::string have;
  tables_.for_each([&have](const ShardTableSpec& spec, ShardTable&) {
    if (have.size() < 512) absl::StrAppend(&have, have.empty() ? "'" : ", '", spec.name, "'");
  });
  return Status(StatusCode::NOT_FOUND,
                absl::StrCat("unknown table '", absl::CHexEscape(name.substr(0, 256)),
                             "' (this shard serves ", have.empty() ? "no table" : have, ")"));
}

Status PsService::kind_for(const ShardTable& t, int optimizer, OptimizerKind* kind) const {
  const ShardTableSpec& spec = t.spec();
  if (optimizer < Optimizer::SGD || optimizer > Optimizer::ADAGRAD)
    return invalid(absl::StrCat("unknown optimizer ", optimizer));
  const auto asked = static_cast<OptimizerKind>(optimizer);
  if (spec.flag_declared) {
    if (asked == OptimizerKind::kAdagrad)
      return invalid(absl::StrCat(
          "table '", spec.name,
          "' was declared by the shard's flags (one state float a row): adagrad needs a table "
          "created with optimizer adagrad (CreateTables, or a job file)"));
    *kind = asked;
    return Status::OK;
  }
  // SGD is the wire's default: a request that names no optimizer runs the table's.
  if (optimizer != Optimizer::SGD && asked != spec.optimizer)
    return invalid(absl::StrCat("optimizer ", optimizer_name(asked), " for table '", spec.name,
                                "', whose optimizer is ", optimizer_name(spec.optimizer)));
  *kind = spec.optimizer;
  return Status::OK;
}

Status PsService::check_lr(float lr, const std::string& who) {
  if (!std::isfinite(lr)) return invalid(absl::StrCat(who, "lr is not finite (", lr, ")"));
  if (!(lr > 0.0f)) return invalid(absl::StrCat(who, "lr must be > 0, got lr ", lr));
  return Status::OK;
}

Status PsService::resolve_parts(const std::string& table, uint32_t dim,
                                const google::protobuf::RepeatedPtrField<TablePart>& parts,
                                size_t n, bool update, float lr, int optimizer,
                                std::vector<Part>* out) const {
  out->clear();
  if (parts.empty()) {  // the one-table form
    Part p;
    PS_RETURN_IF_ERROR(find_table(table, &p.table));
    if (dim != p.table->dim())
      return invalid(absl::StrCat("dim ", dim, " does not match the table's dim ", p.table->dim()));
    p.count = n;
    if (update) {
      PS_RETURN_IF_ERROR(check_lr(lr, ""));
      PS_RETURN_IF_ERROR(kind_for(*p.table, optimizer, &p.kind));
      p.lr = lr;
    }
    out->push_back(p);
    return Status::OK;
  }
  out->reserve(parts.size());
  uint64_t total = 0;
  for (const TablePart& tp : parts) {
    Part p;
    PS_RETURN_IF_ERROR(find_table(tp.table(), &p.table));
    const std::string who = absl::StrCat("table '", p.table->spec().name, "': ");
    for (const Part& q : *out)
      if (q.table == p.table) return invalid(absl::StrCat(who, "named by two parts"));
    if (tp.dim() != p.table->dim())
      return invalid(
          absl::StrCat(who, "dim ", tp.dim(), " does not match the table's dim ", p.table->dim()));
    if (tp.count() > n - std::min<uint64_t>(total, n))
      return invalid(absl::StrCat(who, "the parts' counts exceed the request's ", n, " keys"));
    p.begin = total;
    p.count = tp.count();
    total += tp.count();
    if (update) {
      PS_RETURN_IF_ERROR(check_lr(tp.lr(), who));
      PS_RETURN_IF_ERROR(kind_for(*p.table, optimizer, &p.kind));
      p.lr = tp.lr();
    }
    out->push_back(p);
  }
  if (total != n)
    return invalid(
        absl::StrCat("the parts' counts sum to ", total, ", the request has ", n, " keys"));
  return Status::OK;
}

Status PsService::check_keys(const std::string& keys, size_t* n) const {
  if (keys.size() % sizeof(int64_t) != 0)
    return invalid(absl::StrCat("keys has ", keys.size(), " bytes, not a multiple of 8"));
  *n = keys.size() / sizeof(int64_t);
  return Status::OK;
}

Status PsService::check_grads(const std::vector<Part>& parts, const std::string& grads,
                              Encoding enc) const {
  uint64_t want = 0;
  for (const Part& p : parts)
    want += static_cast<uint64_t>(p.count) * encoded_row_bytes(enc, p.table->dim());
  if (grads.size() == want) return Status::OK;
  if (parts.size() == 1) {
    const uint32_t dim = parts[0].table->dim();
    return invalid(absl::StrCat("grads has ", grads.size(), " bytes, expected ", want, " (",
                                parts[0].count, " keys x ", row_bytes_text(enc, dim), ")"));
  }
  return invalid(absl::StrCat("grads has ", grads.size(), " bytes, expected ", want,
                              " (each part's keys x its table's row bytes)"));
}

Status PsService::check_encoding(int compression, Encoding* enc) const {
  const std::optional<Encoding> e = encoding_from_wire(compression);
  if (!e) return invalid(absl::StrCat("unknown compression ", compression));
  *enc = *e;
  return Status::OK;
}

bool PsService::DecodeBudget::reserve(uint64_t bytes, uint64_t limit, uint64_t* in_use_before) {
  const uint64_t before = in_use_.fetch_add(bytes);
  *in_use_before = before;
  if (before + bytes > limit) {
    in_use_.fetch_sub(bytes);
    return false;
  }
  bytes_ += bytes;
  return true;
}

Status PsService::decode_grads(Encoding enc, const std::vector<Part>& parts,
                               const std::string& keys, std::string* grads,
                               const std::string& where, DecodeBudget* budget) const {
  if (enc == Encoding::kNone) return Status::OK;
  uint64_t decoded = 0;
  for (const Part& p : parts)
    decoded += static_cast<uint64_t>(p.count) * p.table->dim() * sizeof(float);
  uint64_t in_use = 0;
  if (!budget->reserve(decoded, opts_.max_memory_bytes, &in_use))
    return Status(StatusCode::RESOURCE_EXHAUSTED,
                  absl::StrCat("decoding the ", encoding_name(enc), " gradients of ", where,
                               " takes ", decoded, " bytes beside the ", in_use,
                               " bytes other requests are decoding, over max_memory_bytes ",
                               opts_.max_memory_bytes, "; nothing of it is applied (retry)"));
  if (hooks_ != nullptr) hooks_->reach(TestPoint::kDecodeReserved);  // test-only
  std::string rows(decoded, '\0');
  const char* in = grads->data();
  char* out = rows.data();
  for (const Part& p : parts) {
    const uint32_t dim = p.table->dim();
    size_t bad = 0;
    CodecError err;
    if (!decode_rows(enc, in, p.count, dim, out, &bad, &err)) {
      int64_t key;
      std::memcpy(&key, keys.data() + (p.begin + bad) * sizeof(int64_t), sizeof(key));
      const std::string table =
          parts.size() > 1 ? absl::StrCat(" of table '", p.table->spec().name, "'") : "";
      return invalid(absl::StrCat("grads of key ", key, table, " in ", where, " are no valid ",
                                  encoding_name(enc), " row: ", describe(enc, err),
                                  "; nothing of it is applied"));
    }
    in += p.count * encoded_row_bytes(enc, dim);
    out += p.count * dim * sizeof(float);
  }
  grads->swap(rows);
  return Status::OK;
}

Status PsService::check_finite(const std::vector<Part>& parts, const std::string& keys,
                               const std::string& grads, const std::string& where) const {
  const char* g = grads.data();
  for (const Part& p : parts) {
    const uint32_t dim = p.table->dim();
    const size_t count = p.count * dim;
    const size_t i = first_non_finite(g, count);
    if (i < count) {
      const size_t row = p.begin + i / dim;
      int64_t key;
      std::memcpy(&key, keys.data() + row * sizeof(int64_t), sizeof(key));
      float v;
      std::memcpy(&v, g + i * sizeof(float), sizeof(v));
      const std::string table =
          parts.size() > 1 ? absl::StrCat("table '", p.table->spec().name, "' ") : "";
      return invalid(absl::StrCat("non-finite gradient in ", where, ": ", table, "key ", key,
                                  " column ", i % dim, " is ", v, "; nothing of it is applied"));
    }
    g += count * sizeof(float);
  }
  return Status::OK;
}

}  // namespace cpu_dist::ps
