// PsClient: many tables in one call (proto TablePart).  A pull, push or commit of several
// tables costs what one table's does: per shard, the tables' keys lie end to end and are cut
// into RPCs of at most max_keys_per_rpc keys (MultiSplit), each RPC naming its tables' shares
// in table order; a reply's rows follow that order, each table's at its own dim.
#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client.h"
#include "client_calls.h"
#include "hashing.h"
#include "merge.h"
#include "wire.h"

namespace cpu_dist::ps {

namespace {

using client_calls::check_count;
using client_calls::FirstOccurrences;
using client_calls::kCommit;
using client_calls::kPull;
using client_calls::kPush;
using client_calls::refuse_gradient;
using client_calls::set_chunk;
using client_calls::set_commit_head;
using client_calls::to_proto;

// What a multi-table pull's decoders share (they may outlive the call that planned them):
// per table of the pull (in table order), its distinct keys, dim, state width, where its rows
// go, and what its replies report (null without a session).
struct TablesPull {
  std::vector<std::unique_ptr<FirstOccurrences>> firsts;
  std::vector<uint32_t> dims;
  std::vector<uint32_t> widths;
  std::vector<float*> outs;
  std::vector<std::shared_ptr<PullReport>> seen;
  std::unique_ptr<MultiSplit> split;
};

// A multi-table PullResponse (service.cc writes it by hand): the values field, every segment's
// rows encoded as `enc` at its table's dim, then with a session the committed_step and the
// per-row fields asked for, segments in the same order.
grpc::Status decode_tables_reply(const grpc::ByteBuffer& reply, const MultiPart& part,
                                 const TablesPull& st, const std::vector<std::string>& names,
                                 Encoding enc) {
  auto malformed = [&](const std::string& why) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        absl::StrCat("malformed PullResponse: expected the rows of ", part.n, " keys of ",
                     part.segments.size(), " tables encoded as ", encoding_name(enc), why));
  };
  size_t values_bytes = 0, states_floats = 0;
  for (const Segment& sg : part.segments) {
    values_bytes += sg.n * encoded_row_bytes(enc, st.dims[sg.table]);
    states_floats += sg.n * st.widths[sg.table];
  }
  wire::SliceReader r(reply);
  uint64_t len = 0;
  if (!r.read_bytes_header_or_empty(PullResponse::kValuesFieldNumber, &len) ||
      len != values_bytes || r.remaining() < len)
    return malformed("");
  for (const Segment& sg : part.segments) {
    const uint32_t dim = st.dims[sg.table];
    size_t bad = 0;
    CodecError err;
    if (!client_calls::read_rows(r, enc, dim, sg.idx, sg.n, st.outs[sg.table], &bad, &err))
      return malformed(
          absl::StrCat(": table '", names[sg.table], "' row ", bad, ": ", describe(enc, err)));
  }
  if (!st.seen.empty() && st.seen.front() != nullptr) {
    int64_t committed = 0;
    if (!r.read_int64_field(PullResponse::kCommittedStepFieldNumber, &committed))
      return malformed(" and a committed_step (the pull named a session)");
    for (const Segment& sg : part.segments) st.seen[sg.table]->note(committed);
    if (part.segments.empty())  // a shard without keys (PullCommitted): it speaks for all
      for (const auto& report : st.seen) report->note(committed);
    const PullReport& any = *st.seen.front();
    if (any.wants_steps()) {
      if (!r.read_bytes_header_or_empty(PullResponse::kRowStepsFieldNumber, &len) || len != part.n)
        return malformed(absl::StrCat(" and ", part.n, " row_steps"));
      std::vector<uint8_t> beyond(part.n);
      if (!r.read(beyond.data(), part.n)) return malformed(" and row_steps (cut short)");
      size_t at = 0;
      for (const Segment& sg : part.segments) {
        int64_t* steps = st.seen[sg.table]->steps();
        for (size_t j = 0; j < sg.n; ++j, ++at)  // 255: no bound the reader may rely on
          steps[sg.idx[j]] = beyond[at] == 255 ? kUnknownStep : committed + beyond[at];
      }
    }
    if (any.wants_states()) {
      if (!r.read_bytes_header_or_empty(PullResponse::kRowStatesFieldNumber, &len) ||
          len != states_floats * sizeof(float))
        return malformed(absl::StrCat(" and ", states_floats, " row_states floats"));
      for (const Segment& sg : part.segments) {
        const uint32_t w = st.widths[sg.table];
        float* states = st.seen[sg.table]->states();
        for (size_t j = 0; j < sg.n; ++j)
          if (!r.read(states + size_t{sg.idx[j]} * w, w * sizeof(float)))
            return malformed(" and row_states (cut short)");
      }
    }
  }
  if (r.remaining() != 0) return malformed(absl::StrCat(": ", r.remaining(), " bytes too many"));
  return grpc::Status::OK;
}

// The TablePart list of one RPC: its segments' tables (every table of `tables`, those without
// keys in it too, when `every_table`), each with its key count, dim and lr.
template <class Head>
void set_parts(Head* head, const MultiPart& part, const std::vector<ClientTable>& tables,
               const std::vector<uint32_t>& table_of, const std::vector<float>& lrs,
               bool every_table) {
  head->clear_parts();
  auto add = [&](uint32_t t, size_t count) {
    TablePart* tp = head->add_parts();
    const ClientTable& ct = tables[table_of[t]];
    tp->set_table(ct.name);
    tp->set_dim(ct.dim);
    tp->set_count(count);
    if (!lrs.empty()) tp->set_lr(lrs[t]);
  };
  if (!every_table) {
    for (const Segment& sg : part.segments) add(sg.table, sg.n);
    return;
  }
  size_t s = 0;
  for (uint32_t t = 0; t < table_of.size(); ++t) {
    const bool here = s < part.segments.size() && part.segments[s].table == t;
    add(t, here ? part.segments[s].n : 0);
    if (here) ++s;
  }
}

// What a multi-table push or commit sends, per table of the call (in table order): the keys
// to split (a push's merged ones), the keys and gradients its RPCs carry, the table's index
// among the client's tables, and its lr.
struct TablesGrads {
  std::vector<TableKeys> split_in;
  std::vector<TablePayload> payloads;
  std::vector<uint32_t> table_of;
  std::vector<float> lrs;

  void add(const ClientTable& t, uint32_t table, const int64_t* keys, const float* rows, size_t n,
           float lr) {
    split_in.push_back(TableKeys{keys, n, nullptr, table_salt(t.name)});
    payloads.push_back(TablePayload{keys, rows, t.dim});
    table_of.push_back(table);
    lrs.push_back(lr);
  }
};

// One RPC of a multi-table push or commit (Head: PushRequest or CommitRequest): its traffic,
// its tables (set_parts; every table of the call when `every_table`), and its keys and
// gradients after `head`.  A gradient the encoding cannot carry is refused naming `what`
// ("push of", "commit of session S step T rank R") and the table.
template <class Head>
void fill_tables_call(Call& c, const MultiPart& p, Head* head, const TablesGrads& grads,
                      const std::vector<ClientTable>& tables, Encoding enc, bool every_table,
                      const std::string& what) {
  c.traffic = TrafficKind::kPush;
  c.traffic_keys = p.n;
  for (const Segment& sg : p.segments)
    c.traffic_bytes +=
        sg.n * (sizeof(int64_t) + encoded_row_bytes(enc, grads.payloads[sg.table].dim));
  set_parts(head, p, tables, grads.table_of, grads.lrs, every_table);
  if (auto failed = MultiSplit::serialize(p, *head, grads.payloads, Head::kKeysFieldNumber,
                                          Head::kGradsFieldNumber, enc, &c.request))
    refuse_gradient(
        *failed, grads.payloads[failed->table].keys[failed->index], enc,
        absl::StrCat(what, " table '", tables[grads.table_of[failed->table]].name, "'"));
}

}  // namespace

// ---- pull -----------------------------------------------------------------------------------

std::shared_ptr<AsyncOp> PsClient::pull_tables_async(const std::vector<TableKeysIn>& in,
                                                     const PullOptions& po) {
  const std::vector<TableKeysIn> parts = in_table_order(in);
  if ((po.row_steps || po.row_states) && !po.session)
    throw std::invalid_argument("a pull's row_steps and row_states need a session");
  const Encoding enc = po.compression.value_or(opts_.compression);
  auto st = std::make_shared<TablesPull>();
  std::vector<RowBuffer> outputs;
  std::vector<TableKeys> split_in;
  std::vector<std::string> names;
  std::vector<uint32_t> table_of;
  for (const TableKeysIn& p : parts) {
    check_count(p.n);
    const ClientTable& t = opts_.tables[p.table];
    st->firsts.push_back(std::make_unique<FirstOccurrences>(p.keys, p.n));
    st->dims.push_back(t.dim);
    st->widths.push_back(po.row_states ? state_width(p.table) : 1);
    outputs.push_back(alloc_rows(p.n * t.dim));
    st->outs.push_back(outputs.back().get());
    st->seen.push_back(po.session ? std::make_shared<PullReport>(p.n, po.row_steps, po.row_states,
                                                                 st->widths.back())
                                  : nullptr);
    split_in.push_back(TableKeys{p.keys, p.n, st->firsts.back()->select(), table_salt(t.name)});
    names.push_back(t.name);
    table_of.push_back(p.table);
  }
  const PullRoute route = route_pull(po);
  st->split = std::make_unique<MultiSplit>(split_in, limits(), route.rule, next_channel_base());
  PullRequest head;
  head.set_compression(to_proto(enc));
  if (po.session) head.set_session(*po.session);
  if (po.after_step) head.set_after_step(*po.after_step);
  head.set_row_steps(po.row_steps);
  head.set_row_states(po.row_states);
  std::vector<TablePayload> payloads;
  for (const TableKeysIn& p : parts) payloads.push_back(TablePayload{p.keys, nullptr, 0});
  Calls calls;
  for (const MultiPart& p : st->split->parts()) {
    Call& c = add_call(calls, p.shard, p.channel, route.method);
    c.idempotent = true;
    c.traffic = TrafficKind::kPull;
    c.traffic_keys = p.n;
    c.traffic_bytes = 0;
    for (const Segment& sg : p.segments)  // keys out; rows, row_steps and row_states back
      c.traffic_bytes +=
          sg.n * (sizeof(int64_t) + encoded_row_bytes(enc, st->dims[sg.table]) +
                  (po.row_steps ? 1 : 0) + (po.row_states ? st->widths[sg.table] * 4 : 0));
    set_parts(&head, p, opts_.tables, table_of, {}, po.after_step.has_value());
    (void)MultiSplit::serialize(p, head, payloads, PullRequest::kKeysFieldNumber, 0, enc,
                                &c.request);  // keys only: cannot fail
    c.on_reply = [st, &p, names, enc](Call& call) {
      return decode_tables_reply(call.response, p, *st, names, enc);
    };
  }
  std::vector<std::shared_ptr<const PullReport>> seen(st->seen.begin(), st->seen.end());
  auto finish = [st] {
    for (size_t t = 0; t < st->firsts.size(); ++t) {
      const FirstOccurrences& f = *st->firsts[t];
      if (!f.has_duplicates()) continue;
      f.copy_duplicates(st->outs[t], st->dims[t]);
      PullReport* r = st->seen[t].get();
      if (r && r->wants_steps()) f.copy_duplicates(r->steps(), 1);
      if (r && r->wants_states()) f.copy_duplicates(r->states(), r->state_width());
    }
  };
  return run_async(std::move(calls), std::move(finish), std::move(outputs), std::move(seen),
                   route.timeout_s);
}

// ---- push / commit --------------------------------------------------------------------------

std::shared_ptr<AsyncOp> PsClient::push_tables_async(const std::vector<TableGradients>& in,
                                                     std::optional<OptimizerKind> optimizer) {
  const std::vector<TableGradients> parts = in_table_order(in);
  // Merge duplicates per table here (in order) so that splitting never applies a key twice.
  std::vector<std::unique_ptr<RowAccumulator>> accs;
  TablesGrads grads;
  for (const TableGradients& g : parts) {
    check_count(g.n);
    const ClientTable& t = opts_.tables[g.table];
    accs.push_back(std::make_unique<RowAccumulator>(t.dim));
    RowAccumulator& acc = *accs.back();
    acc.reserve(g.n);
    acc.add(g.keys, g.grads, g.n);
    grads.add(t, g.table, acc.keys().data(), acc.sums().data(), acc.size(), g.lr);
  }
  const MultiSplit split(grads.split_in, limits(), SplitRule::kSpreadOverChannels,
                         next_channel_base());
  const Encoding enc = opts_.compression;
  PushRequest head;
  head.set_compression(to_proto(enc));
  if (optimizer) head.set_optimizer(to_proto(*optimizer));
  Calls calls;
  for (const MultiPart& p : split.parts())
    fill_tables_call(add_call(calls, p.shard, p.channel, kPush), p, &head, grads, opts_.tables, enc,
                     false, "push of");
  return run_async(std::move(calls));
}

std::shared_ptr<AsyncOp> PsClient::commit_tables_async(const CommitPoint& at,
                                                       const std::vector<TableGradients>& in,
                                                       std::optional<OptimizerKind> optimizer) {
  const std::vector<TableGradients> parts = in_table_order(in);
  // No merging: the shard sums per key in rank then chunk order, which is input order.
  TablesGrads grads;
  for (const TableGradients& g : parts) {
    check_count(g.n);
    grads.add(opts_.tables[g.table], g.table, g.keys, g.grads, g.n, g.lr);
  }
  const MultiSplit split(grads.split_in, limits(), SplitRule::kChunkEveryShard,
                         next_channel_base());
  const Encoding enc = opts_.compression;
  CommitRequest head;
  set_commit_head(&head, at, enc);
  if (optimizer) head.set_optimizer(to_proto(*optimizer));
  const std::string where = commit_where(at);
  Calls calls;
  for (const MultiPart& p : split.parts()) {
    set_chunk(&head, p.index, p.count);
    Call& c = add_call(calls, p.shard, p.channel, kCommit);
    c.idempotent = true;  // the shard acknowledges an identical chunk again
    fill_tables_call(c, p, &head, grads, opts_.tables, enc, true, where);
  }
  return run_async(std::move(calls));
}

// ---- optimizer state widths -----------------------------------------------------------------

uint32_t PsClient::state_width(uint32_t table) {
  const ClientTable& t = opts_.tables.at(table);
  {
    std::lock_guard<std::mutex> lock(widths_mu_);
    auto it = state_widths_.find(t.name);
    if (it != state_widths_.end()) return it->second;
  }
  // Once per table: the shards' specs (every shard holds every table with one spec).
  const std::vector<HealthResponse> replies = health();
  std::lock_guard<std::mutex> lock(widths_mu_);
  for (const HealthResponse& h : replies)
    for (const TableSpec& spec : h.tables())
      state_widths_[spec.name()] =
          state_floats(static_cast<OptimizerKind>(static_cast<int>(spec.optimizer())), spec.dim());
  auto it = state_widths_.find(t.name);
  return it == state_widths_.end() ? 1 : it->second;  // not there: the shard refuses the pull
}

}  // namespace cpu_dist::ps
