// The Redis tier: a volatile cache that several servers share (docs/SERVING.md, "Tiered
// embedding store"). Keys are partitioned: row (table, id) is in partition
// p = mix(table, id) % partitions, key "<prefix>{<p>}:<table>:<id>" (the braces are a Redis
// Cluster hash tag: a partition's keys share a slot), value the row's dim floats, f32
// little-endian. A lookup sends one MGET per partition, pipelined (all sent, then all replies
// read); a fill one MSET per partition. A value of the wrong size for its table is a miss
// (counted in stats.bad_values, logged once per table): the row is read from the tier below,
// whose fill overwrites it. The connection is made at load and again after an error, so a Redis
// that comes back is used again without a restart; while it is down, lookups and fills fail
// naming the address (EmbeddingStore then asks the tier below). A Redis down at load does not
// fail the load (the tier below holds every row): the tier starts failing and is logged. While
// it is down, connections are tried at most once per retry_ms, so an address that does not
// answer costs timeout_ms once per interval, not on every lookup.
#include <sys/time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "dlrec/core/error.h"
#include "dlrec/store/embedding_store.h"

#ifdef DLREC_WITH_REDIS
#include <hiredis.h>
#endif

namespace dlrec::store {

#ifdef DLREC_WITH_REDIS

namespace {

uint64_t mix(uint64_t z) {  // splitmix64's finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisTier final : public Tier {
 public:
  RedisTier(const std::vector<TableInfo>& tables, const StoreConfig& c)
      : tables_(tables),
        host_(c.redis_host),
        port_(c.redis_port),
        // Keys carry the export's id where known: rows of two exports never mix in a Redis
        // that several models or versions share.
        prefix_(c.rocksdb_export_id.empty() ? c.redis_key_prefix
                                            : c.redis_key_prefix + "." + c.rocksdb_export_id),
        partitions_(c.redis_partitions),
        timeout_ms_(c.redis_timeout_ms),
        retry_ms_(c.redis_retry_ms),
        bad_logged_(tables.size(), false) {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      connect();
    } catch (const Error& e) {  // an outage at load: served from the tiers below meanwhile
      stats.failing = 1;
      std::fprintf(stderr,
                   "dlrec store: %s (at load; the redis tier is passed over until it answers)\n",
                   e.what());
    }
  }
  ~RedisTier() override {
    if (ctx_) redisFree(ctx_);
  }
  std::string name() const override { return "redis"; }
  bool complete() const override { return false; }
  int64_t memory_bound() const override { return 0; }  // held by the Redis server

  void lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) override {
    const int64_t dim = tables_[table].dim;
    std::vector<std::vector<int64_t>> parts = partition(table, ids, n);
    std::lock_guard<std::mutex> lock(mu_);
    run([&] {
      for (const auto& part : parts)
        if (!part.empty()) send(table, "MGET", ids, part, nullptr, 0);
      for (const auto& part : parts) {
        if (part.empty()) continue;
        Reply r = reply();
        DLREC_CHECK(r->type == REDIS_REPLY_ARRAY && r->elements == part.size(), where(),
                    ": MGET answered ", describe(*r));
        for (size_t j = 0; j < part.size(); ++j) {
          const redisReply* e = r->element[j];
          if (e->type == REDIS_REPLY_NIL) continue;
          const int64_t i = part[j];
          if (e->type != REDIS_REPLY_STRING || static_cast<int64_t>(e->len) != dim * 4) {
            bad_value(table, ids[i], *e, dim);  // a miss: the row below overwrites it
            continue;
          }
          std::memcpy(out + i * dim, e->str, static_cast<size_t>(dim) * 4);
          found[i] = 1;
        }
      }
    });
  }

  void fill(int table, const int64_t* ids, int64_t n, const float* rows) override {
    const int64_t dim = tables_[table].dim;
    std::vector<std::vector<int64_t>> parts = partition(table, ids, n);
    std::lock_guard<std::mutex> lock(mu_);
    run([&] {
      int64_t sent = 0;
      for (const auto& part : parts)
        if (!part.empty()) {
          send(table, "MSET", ids, part, rows, dim);
          ++sent;
        }
      for (int64_t k = 0; k < sent; ++k) {
        Reply r = reply();
        DLREC_CHECK(r->type == REDIS_REPLY_STATUS, where(), ": MSET answered ", describe(*r));
      }
    });
  }

 private:
  std::string where() const { return "redis tier " + host_ + ":" + std::to_string(port_); }
  // A value that is not a row of the table (another model's key under the same prefix, a value
  // written by hand): counted, logged once per table, and treated as a miss, so the row is read
  // from the next tier and its fill overwrites the value. Under mu_.
  void bad_value(int table, int64_t id, const redisReply& e, int64_t dim) {
    stats.bad_values += 1;
    if (bad_logged_[table]) return;
    bad_logged_[table] = true;
    std::fprintf(stderr,
                 "dlrec store: %s: key %s holds %s, expected a row of %lld bytes (another model's "
                 "keys under the same prefix?); read from the next tier and overwritten (further "
                 "such values of table '%s' are counted, not logged)\n",
                 where().c_str(), key(table, id).c_str(), describe(e).c_str(),
                 static_cast<long long>(dim * 4), tables_[table].name.c_str());
  }
  std::string key(int table, int64_t id) const {
    return prefix_ + "{" +
           std::to_string(mix((uint64_t(table) << 48) ^ uint64_t(id)) %
                          static_cast<uint64_t>(partitions_)) +
           "}:" + std::to_string(table) + ":" + std::to_string(id);
  }
  static std::string describe(const redisReply& r) {
    if (r.type == REDIS_REPLY_ERROR) return "an error: " + std::string(r.str, r.len);
    if (r.type == REDIS_REPLY_STRING) return std::to_string(r.len) + " bytes";
    if (r.type == REDIS_REPLY_NIL) return "nil";
    return "a reply of type " + std::to_string(r.type);
  }
  // Positions of ids[0..n) per partition.
  std::vector<std::vector<int64_t>> partition(int table, const int64_t* ids, int64_t n) const {
    std::vector<std::vector<int64_t>> parts(static_cast<size_t>(partitions_));
    for (int64_t i = 0; i < n; ++i)
      parts[mix((uint64_t(table) << 48) ^ uint64_t(ids[i])) % parts.size()].push_back(i);
    return parts;
  }
  // Connects unless connected; true when it made a new connection. After a failed attempt the
  // next one waits retry_ms; a call before that fails at once with the last error.
  bool connect() {
    if (ctx_ && !ctx_->err) return false;
    if (ctx_) redisFree(ctx_);
    ctx_ = nullptr;
    const auto now = std::chrono::steady_clock::now();
    if (!last_error_.empty() && now < retry_at_) {
      const auto wait =
          std::chrono::duration_cast<std::chrono::milliseconds>(retry_at_ - now).count();
      fail(where(), ": cannot connect: ", last_error_, " (next attempt in ", wait, " ms)");
    }
    timeval tv{timeout_ms_ / 1000, static_cast<suseconds_t>((timeout_ms_ % 1000) * 1000)};
    ctx_ = redisConnectWithTimeout(host_.c_str(), port_, tv);
    DLREC_CHECK(ctx_ != nullptr, where(), ": cannot allocate a connection");
    if (ctx_->err) {
      last_error_ = ctx_->errstr;
      retry_at_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(retry_ms_);
      redisFree(ctx_);
      ctx_ = nullptr;
      fail(where(), ": cannot connect: ", last_error_);
    }
    last_error_.clear();
    redisSetTimeout(ctx_, tv);
    return true;
  }
  // Runs fn on a live connection. Any error drops the connection (replies of a pipeline may be
  // left unread). An I/O error on a connection made before this call (Redis restarted since)
  // is retried once on a new one; fn must be repeatable (MGET, MSET are).
  template <class F>
  void run(F&& fn) {
    for (int attempt = 0;; ++attempt) {
      const bool fresh = connect();
      try {
        fn();
        return;
      } catch (...) {
        const bool io_error = ctx_ != nullptr && ctx_->err != 0;
        if (ctx_) redisFree(ctx_);
        ctx_ = nullptr;
        if (io_error && !fresh && attempt == 0) continue;
        throw;
      }
    }
  }
  void send(int table, const char* cmd, const int64_t* ids, const std::vector<int64_t>& part,
            const float* rows, int64_t dim) {
    std::vector<std::string> keys;
    keys.reserve(part.size());
    for (int64_t i : part) keys.push_back(key(table, ids[i]));
    std::vector<const char*> argv{cmd};
    std::vector<size_t> lens{std::strlen(cmd)};
    for (size_t j = 0; j < part.size(); ++j) {
      argv.push_back(keys[j].data());
      lens.push_back(keys[j].size());
      if (rows) {
        argv.push_back(reinterpret_cast<const char*>(rows + part[j] * dim));
        lens.push_back(static_cast<size_t>(dim) * 4);
      }
    }
    DLREC_CHECK(redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(),
                                       lens.data()) == REDIS_OK,
                where(), ": ", ctx_->errstr);
  }
  Reply reply() {
    void* r = nullptr;
    if (redisGetReply(ctx_, &r) != REDIS_OK || !r)
      fail(where(), ": ", ctx_->err ? ctx_->errstr : "no reply", " (is the Redis server running?)");
    return Reply(static_cast<redisReply*>(r));
  }

  std::vector<TableInfo> tables_;
  std::string host_;
  int port_;
  std::string prefix_;
  int64_t partitions_, timeout_ms_, retry_ms_;
  std::string last_error_;  // of the last failed connection attempt, until one succeeds
  std::chrono::steady_clock::time_point retry_at_;  // no attempt before this after a failure
  std::vector<bool> bad_logged_;                    // per table: a bad value was logged (under mu_)
  std::mutex mu_;                                   // one connection, one request at a time
  redisContext* ctx_ = nullptr;
};

}  // namespace

bool redis_available() { return true; }

std::unique_ptr<Tier> open_redis_tier(const std::vector<TableInfo>& tables,
                                      const StoreConfig& config) {
  return std::make_unique<RedisTier>(tables, config);
}

#else  // built without libhiredis-dev

bool redis_available() { return false; }

std::unique_ptr<Tier> open_redis_tier(const std::vector<TableInfo>&, const StoreConfig& config) {
  fail("redis tier (", config.redis_host, ":", config.redis_port,
       "): this dlrec was built without hiredis (libhiredis-dev; scripts/install-deps.sh)");
}

#endif

}  // namespace dlrec::store
