// Online updates through Redis Streams: the publisher (dlrec push) and the consumer thread of a
// serving store (include/dlrec/store/updates.h describes the entries and the versions).
#include <sys/time.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "dlrec/core/error.h"
#include "dlrec/store/updates.h"

#ifdef DLREC_WITH_REDIS
#include <hiredis.h>
#endif

namespace dlrec::store {

#ifdef DLREC_WITH_REDIS
namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

Context connect(const StreamAddress& at) {
  timeval tv{at.timeout_ms / 1000, static_cast<suseconds_t>((at.timeout_ms % 1000) * 1000)};
  Context c(redisConnectWithTimeout(at.host.c_str(), at.port, tv));
  DLREC_CHECK(c != nullptr, at.str(), ": cannot allocate a connection");
  DLREC_CHECK(!c->err, at.str(), ": cannot connect: ", c->errstr);
  redisSetTimeout(c.get(), tv);
  return c;
}

Reply command(redisContext* c, const StreamAddress& at, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  void* r = redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
  if (!r) fail(at.str(), ": ", c->err ? c->errstr : "no reply", " (is the Redis server running?)");
  Reply reply(static_cast<redisReply*>(r));
  DLREC_CHECK(reply->type != REDIS_REPLY_ERROR, at.str(), ": ", args[0],
              " answered an error: ", std::string(reply->str, reply->len));
  return reply;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// An entry's fields ([id, [field, value, ...]]) as a map.
std::map<std::string, std::string> fields_of(const redisReply& entry) {
  std::map<std::string, std::string> f;
  if (entry.type != REDIS_REPLY_ARRAY || entry.elements != 2) return f;
  const redisReply* kv = entry.element[1];
  if (kv->type != REDIS_REPLY_ARRAY) return f;
  for (size_t i = 0; i + 1 < kv->elements; i += 2)
    f[std::string(kv->element[i]->str, kv->element[i]->len)] =
        std::string(kv->element[i + 1]->str, kv->element[i + 1]->len);
  return f;
}

uint64_t parse_version(const std::map<std::string, std::string>& f, const std::string& where) {
  auto it = f.find("version");
  DLREC_CHECK(it != f.end(), where, ": no 'version' field");
  const std::string& v = it->second;
  DLREC_CHECK(
      !v.empty() && v.size() <= 19 && v.find_first_not_of("0123456789") == std::string::npos, where,
      ": version '", v.substr(0, 40), "' is not a number");
  return std::stoull(v);
}

}  // namespace

void append_stream_entry(const StreamAddress& at,
                         const std::vector<std::pair<std::string, std::string>>& fields) {
  Context c = connect(at);
  std::vector<std::string> args{"XADD", at.key, "*"};
  for (const auto& [k, v] : fields) {
    args.push_back(k);
    args.push_back(v);
  }
  command(c.get(), at, args);
}

uint64_t publish_update(const StreamAddress& at, const std::vector<TableInfo>& tables,
                        const std::vector<RowUpdate>& updates, int64_t chunk_rows,
                        uint64_t given_version) {
  DLREC_CHECK(chunk_rows > 0, "push: chunk rows must be positive");
  DLREC_CHECK(given_version == 0 || given_version >= 2, "push: version ", given_version,
              ": versions start at 2 (the export is version 1)");
  Context c = connect(at);
  // The last entry says which version comes next: after a commit the one after it; after an
  // unfinished push (its pusher died) that push's version again (its begin entry is repeated,
  // which tells consumers to drop what they gathered of it).
  uint64_t version = given_version ? given_version : 2;
  if (!given_version) {
    Reply last = command(c.get(), at, {"XREVRANGE", at.key, "+", "-", "COUNT", "1"});
    if (last->type == REDIS_REPLY_ARRAY && last->elements == 1) {
      const auto f = fields_of(*last->element[0]);
      const uint64_t v = parse_version(f, at.str() + ": its last entry");
      const auto type = f.find("type");
      version = (type != f.end() && type->second == "commit") ? v + 1 : v;
    }
  }
  const std::string v = std::to_string(version);
  command(c.get(), at, {"XADD", at.key, "*", "type", "begin", "version", v});
  int64_t total = 0;
  for (const RowUpdate& u : updates) {
    DLREC_CHECK(u.table >= 0 && u.table < static_cast<int>(tables.size()), "push: table index ",
                u.table);
    const TableInfo& t = tables[static_cast<size_t>(u.table)];
    const int64_t n = static_cast<int64_t>(u.ids.size());
    for (int64_t first = 0; first < n; first += chunk_rows) {
      const int64_t m = std::min(chunk_rows, n - first);
      std::string ids(reinterpret_cast<const char*>(u.ids.data() + first),
                      static_cast<size_t>(m) * 8);
      std::string rows(reinterpret_cast<const char*>(u.rows.data() + first * t.dim),
                       static_cast<size_t>(m * t.dim) * 4);
      command(c.get(), at,
              {"XADD", at.key, "*", "type", "rows", "version", v, "table", t.name, "dim",
               std::to_string(t.dim), "ids", std::move(ids), "rows", std::move(rows)});
    }
    total += n;
  }
  command(c.get(), at,
          {"XADD", at.key, "*", "type", "commit", "version", v, "rows", std::to_string(total),
           "time_ms", std::to_string(now_ms())});
  return version;
}

struct UpdateConsumer::Impl {
  StreamAddress at;
  int64_t block_ms;
  UpdateTier* tier;
  std::vector<Tier*> caches;
  std::atomic<bool> stop{false};
  std::thread thread;
  Context ctx;
  std::string last_id = "0-0";  // the stream from its first entry: every version replays
  // The version being gathered (from its begin entry), its rows, and why it is refused ("").
  uint64_t pending_version = 0;
  std::vector<RowUpdate> pending;
  std::string pending_error;
  std::mutex caught_up_mu;
  std::condition_variable caught_up_cv;
  bool caught_up = false;  // the stream was read to its end once (or could not be read)

  void mark_caught_up() {
    std::lock_guard<std::mutex> lock(caught_up_mu);
    caught_up = true;
    caught_up_cv.notify_all();
  }

  void log(const std::string& e) {
    std::fprintf(stderr, "dlrec store updates: %s\n", e.c_str());
    tier->updates.set_error(e);
  }

  void run() {
    std::string last_stream_error;
    while (!stop) {
      try {
        if (!ctx) ctx = connect(at);
        Reply r = command(ctx.get(), at,
                          {"XREAD", "COUNT", "64", "BLOCK", std::to_string(block_ms), "STREAMS",
                           at.key, last_id});
        last_stream_error.clear();
        if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {  // nil: nothing new
          mark_caught_up();
          continue;
        }
        const redisReply* stream = r->element[0];
        DLREC_CHECK(stream->type == REDIS_REPLY_ARRAY && stream->elements == 2, at.str(),
                    ": XREAD answered an unexpected shape");
        const redisReply* entries = stream->element[1];
        for (size_t i = 0; i < entries->elements; ++i) {
          const redisReply* e = entries->element[i];
          if (e->type != REDIS_REPLY_ARRAY || e->elements != 2) continue;
          last_id.assign(e->element[0]->str, e->element[0]->len);
          handle(fields_of(*e), at.str() + " entry " + last_id);
        }
      } catch (const std::exception& ex) {
        // The stream cannot be read (Redis down, restarted): log once per distinct error, keep
        // serving the applied version, try again shortly.
        ctx.reset();
        mark_caught_up();  // an unreadable stream does not hold the store's opening back
        if (ex.what() != last_stream_error) {
          last_stream_error = ex.what();
          log(last_stream_error + " (still serving version " + std::to_string(tier->version()) +
              "; retrying)");
        }
        for (int k = 0; k < 4 && !stop; ++k)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }

  void handle(const std::map<std::string, std::string>& f, const std::string& where) {
    auto type = f.find("type");
    try {
      DLREC_CHECK(type != f.end(), where, ": no 'type' field");
      const uint64_t v = parse_version(f, where);
      if (type->second == "begin") {
        pending_version = v;
        pending.clear();
        pending_error.clear();
      } else if (type->second == "rows") {
        if (!pending_error.empty()) return;  // the version is refused already
        DLREC_CHECK(v == pending_version, where, ": rows of version ", v,
                    " without its begin entry");
        pending.push_back(parse_rows(f, where));
      } else if (type->second == "commit") {
        commit(v, f, where);
      } else {
        fail(where, ": unknown type '", type->second.substr(0, 40), "'");
      }
    } catch (const std::exception& ex) {
      if (pending_error.empty()) pending_error = ex.what();
    }
  }

  RowUpdate parse_rows(const std::map<std::string, std::string>& f, const std::string& where) {
    for (const char* k : {"table", "dim", "ids", "rows"})
      DLREC_CHECK(f.count(k), where, ": no '", k, "' field");
    const std::string& name = f.at("table");
    const auto& tables = tier->tables();
    RowUpdate u;
    u.table = -1;
    for (size_t t = 0; t < tables.size(); ++t)
      if (tables[t].name == name) u.table = static_cast<int>(t);
    DLREC_CHECK(u.table >= 0, where, ": unknown table '", name.substr(0, 100),
                "' (the model's tables: ", tables.empty() ? "none" : tables[0].name, " ...)");
    const TableInfo& t = tables[static_cast<size_t>(u.table)];
    DLREC_CHECK(f.at("dim") == std::to_string(t.dim), where, ": table '", name, "' has dim ", t.dim,
                ", the entry says ", f.at("dim").substr(0, 20));
    const std::string& ids = f.at("ids");
    const std::string& rows = f.at("rows");
    DLREC_CHECK(ids.size() % 8 == 0, where, ": 'ids' holds ", ids.size(),
                " bytes, not a multiple of 8 (i64 ids)");
    const size_t n = ids.size() / 8;
    DLREC_CHECK(rows.size() == n * static_cast<size_t>(t.dim) * 4, where, ": 'rows' holds ",
                rows.size(), " bytes, expected ", n, " rows x ", t.dim, " floats x 4");
    u.ids.resize(n);
    std::memcpy(u.ids.data(), ids.data(), ids.size());
    for (size_t i = 0; i < n; ++i)
      DLREC_CHECK(u.ids[i] >= 0 && u.ids[i] < t.rows, where, ": id ", u.ids[i],
                  " is beyond table '", name, "' (", t.rows, " rows)");
    u.rows.resize(n * static_cast<size_t>(t.dim));
    std::memcpy(u.rows.data(), rows.data(), rows.size());
    return u;
  }

  void commit(uint64_t v, const std::map<std::string, std::string>& f, const std::string& where) {
    const uint64_t have = tier->version();
    std::string refused;
    if (v != pending_version)
      refused = where + ": commit of version " + std::to_string(v) + " without its begin entry";
    else if (!pending_error.empty())
      refused = pending_error;
    if (refused.empty() && v <= have) return;  // applied already (a replay): nothing to do
    if (refused.empty()) {
      try {
        tier->apply(v, pending);
        for (const RowUpdate& u : pending)
          for (Tier* c : caches)
            c->invalidate(u.table, u.ids.data(), static_cast<int64_t>(u.ids.size()));
        auto t = f.find("time_ms");
        if (t != f.end() && !t->second.empty() && t->second.size() <= 18 &&
            t->second.find_first_not_of("0123456789") == std::string::npos)
          tier->updates.lag_ms = now_ms() - std::stoll(t->second);
        tier->publish_stats();
      } catch (const std::exception& ex) {
        refused = where + ": " + ex.what();
      }
    }
    pending.clear();
    pending_error.clear();
    pending_version = 0;
    if (!refused.empty()) {
      // The error first: whoever sees the counter move finds the error that moved it.
      log("version " + std::to_string(v) + " rejected: " + refused + "; serving version " +
          std::to_string(tier->version()));
      tier->updates.versions_rejected += 1;
      tier->publish_stats();
    }
  }
};

UpdateConsumer::UpdateConsumer(StreamAddress at, int64_t block_ms, UpdateTier* tier,
                               std::vector<Tier*> caches)
    : impl_(std::make_unique<Impl>()) {
  impl_->at = std::move(at);
  impl_->block_ms = block_ms;
  impl_->tier = tier;
  impl_->caches = std::move(caches);
  impl_->thread = std::thread([this] { impl_->run(); });
}

UpdateConsumer::~UpdateConsumer() {
  impl_->stop = true;
  impl_->thread.join();
}

bool UpdateConsumer::wait_caught_up(int64_t ms) {
  std::unique_lock<std::mutex> lock(impl_->caught_up_mu);
  return impl_->caught_up_cv.wait_for(lock, std::chrono::milliseconds(ms),
                                      [&] { return impl_->caught_up; });
}

#else  // built without libhiredis-dev

uint64_t publish_update(const StreamAddress& at, const std::vector<TableInfo>&,
                        const std::vector<RowUpdate>&, int64_t, uint64_t) {
  fail(at.str(), ": this dlrec was built without hiredis (libhiredis-dev): no online updates");
}
void append_stream_entry(const StreamAddress& at,
                         const std::vector<std::pair<std::string, std::string>>&) {
  fail(at.str(), ": this dlrec was built without hiredis (libhiredis-dev): no online updates");
}

struct UpdateConsumer::Impl {};
UpdateConsumer::UpdateConsumer(StreamAddress at, int64_t, UpdateTier*, std::vector<Tier*>) {
  fail(at.str(), ": this dlrec was built without hiredis (libhiredis-dev): no online updates");
}
UpdateConsumer::~UpdateConsumer() = default;
bool UpdateConsumer::wait_caught_up(int64_t) { return false; }

#endif

}  // namespace dlrec::store
