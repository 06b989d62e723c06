// The ratings example's data (`dlrec datagen --schema ratings`, io::generate_ratings): a ratings
// log and its user and item side tables, with the signal planted in the side tables'
// features. Deterministic: every draw comes from a splitmix64 stream seeded by (seed, what,
// index) and the math is datagen_math's, so the same config gives the same bytes everywhere.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/io/datagen.h"
#include "io/datagen_math.h"

namespace dlrec::io {
namespace {

using namespace datagen_math;

// Stream salts: users, items, the per-country/per-category weights, rows.
constexpr uint64_t kUserSalt = 0x05E25ull, kItemSalt = 0x17E35ull, kWeightSalt = 0x3E16ull,
                   kRowSalt = 0x2A7E5ull;
constexpr double kAgeMean = 46.5, kAgeSpread = 16.5;  // age uniform in [18, 75)
constexpr double kLogPriceMean = 2.5, kLogPriceSpread = 0.8;

Rng stream(uint64_t seed, uint64_t salt, uint64_t index) {
  return Rng(mix64(seed ^ mix64(salt * 0x100000001B3ull + index)));
}

// A standard normal draw (Irwin-Hall: the sum of 12 uniforms minus 6; exact arithmetic).
double normal(Rng& r) {
  double s = -6.0;
  for (int i = 0; i < 12; ++i) s += r.uniform();
  return s;
}

// A skewed index in [0, n): popular ones first (density ~ x^-1/2).
int64_t skewed(Rng& r, int64_t n) {
  const double u = r.uniform();
  return std::min(n - 1, static_cast<int64_t>(static_cast<double>(n) * u * u));
}

struct User {
  int age = -1;  // -1: missing
  int country = 0;
};
struct Item {
  bool listed = true;  // in items.csv
  int category = 0;
  int64_t cents = 0;
};

void append_int(std::string& s, int64_t v) { s += std::to_string(v); }

double auc_of(std::vector<std::pair<double, int>>& v) {
  std::sort(v.begin(), v.end());
  double pos = 0, neg = 0, neg_below = 0, sum = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    double gp = 0, gn = 0;
    for (; j < v.size() && v[j].first == v[i].first; ++j) (v[j].second ? gp : gn) += 1;
    sum += gp * (neg_below + 0.5 * gn);
    neg_below += gn;
    pos += gp;
    neg += gn;
    i = j;
  }
  return pos == 0 || neg == 0 ? 0.5 : sum / (pos * neg);
}

void write_whole(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

}  // namespace

RatingsResult generate_ratings(const RatingsConfig& c, const std::string& dir) {
  DLREC_CHECK(c.rows >= 1, "datagen ratings: rows must be >= 1, got ", c.rows);
  DLREC_CHECK(c.users >= 1 && c.items >= 1, "datagen ratings: users and items must be >= 1");
  DLREC_CHECK(c.countries >= 1 && c.categories >= 1,
              "datagen ratings: countries and categories must be >= 1");
  DLREC_CHECK(c.missing_item_every >= 2, "datagen ratings: missing_item_every must be >= 2");
  DLREC_CHECK(c.comment_lines >= 0, "datagen ratings: comment_lines must be >= 0");
  make_dirs(dir);
  RatingsResult res;
  res.ratings = dir + "/ratings.csv";
  res.users = dir + "/users.csv";
  res.items = dir + "/items.csv";

  // The planted weights: per country, per category, and a rank-1 country x category affinity.
  // They do not depend on the seed: files of different seeds share one signal.
  std::vector<double> w_country(c.countries), a_country(c.countries);
  std::vector<double> w_category(c.categories), b_category(c.categories);
  for (int k = 0; k < c.countries; ++k) {
    Rng r = stream(0, kWeightSalt, static_cast<uint64_t>(k));
    w_country[k] = 0.6 * normal(r);
    a_country[k] = normal(r);
  }
  for (int k = 0; k < c.categories; ++k) {
    Rng r = stream(0, kWeightSalt, 1000000 + static_cast<uint64_t>(k));
    w_category[k] = 0.6 * normal(r);
    b_category[k] = normal(r);
  }

  std::vector<User> users(static_cast<size_t>(c.users));
  std::string text = "user,age,country\n";
  for (int64_t u = 0; u < c.users; ++u) {
    Rng r = stream(c.seed, kUserSalt, static_cast<uint64_t>(u));
    User& x = users[u];
    x.age = r.uniform() < 0.05 ? -1 : 18 + static_cast<int>(57.0 * r.uniform());
    x.country = static_cast<int>(skewed(r, c.countries));
    text += "u";
    append_int(text, u);
    text += ",";
    if (x.age >= 0) append_int(text, x.age);
    text += ",c";
    append_int(text, x.country);
    text += "\n";
  }
  write_whole(res.users, text);

  std::vector<Item> items(static_cast<size_t>(c.items));
  text = "item,category,price\n";
  for (int64_t i = 0; i < c.items; ++i) {
    Rng r = stream(c.seed, kItemSalt, static_cast<uint64_t>(i));
    Item& x = items[i];
    x.listed = i % c.missing_item_every != c.missing_item_every - 1;
    x.category = static_cast<int>(r.uniform() * c.categories) % c.categories;
    x.cents = std::max<int64_t>(
        1, static_cast<int64_t>(det_exp(kLogPriceMean + kLogPriceSpread * normal(r)) * 100 + 0.5));
    if (!x.listed) continue;
    text += "i";
    append_int(text, i);
    text += ",k";
    append_int(text, x.category);
    text += ",";
    append_int(text, x.cents / 100);
    text += x.cents % 100 < 10 ? ".0" : ".";
    append_int(text, x.cents % 100);
    text += "\n";
  }
  write_whole(res.items, text);

  text.clear();
  for (int k = 0; k < c.comment_lines; ++k)
    text += k == 0 ? "# dlrec datagen --schema ratings: synthetic ratings (user, item, rating "
                     "1-5, unix timestamp)\n"
                   : "# side tables: users.csv (user, age, country), items.csv (item, category, "
                     "price)\n";
  text += "user,item,rating,timestamp\n";
  std::vector<std::pair<double, int>> scored(static_cast<size_t>(c.rows));
  int64_t positives = 0;
  const int64_t valid_from = c.rows - c.rows / 10;
  for (int64_t row = 0; row < c.rows; ++row) {
    Rng r = stream(c.seed, kRowSalt, static_cast<uint64_t>(row));
    const int64_t u = skewed(r, c.users), i = skewed(r, c.items);
    const User& us = users[u];
    const Item& it = items[i];
    double logit = 0.1;
    if (us.age >= 0) logit -= 0.5 * (us.age - kAgeMean) / kAgeSpread;
    logit += w_country[us.country];
    if (it.listed) {
      const double z =
          (det_log(static_cast<double>(it.cents) / 100) - kLogPriceMean) / kLogPriceSpread;
      logit +=
          w_category[it.category] - 0.5 * z + 0.5 * a_country[us.country] * b_category[it.category];
    }
    const int positive = r.uniform() < sigmoid(logit) ? 1 : 0;
    const int rating = positive ? 4 + (r.uniform() < 0.5 ? 1 : 0)
                                : 1 + std::min(2, static_cast<int>(3 * r.uniform()));
    positives += positive;
    scored[row] = {logit, positive};
    text += "u";
    append_int(text, u);
    text += ",i";
    append_int(text, i);
    text += ",";
    append_int(text, rating);
    text += ",";
    append_int(text, 1700000000 + row * 7 + static_cast<int64_t>(7 * r.uniform()));
    text += "\n";
  }
  write_whole(res.ratings, text);
  res.rows = c.rows;
  res.bytes = static_cast<int64_t>(text.size());
  res.positive_rate = static_cast<double>(positives) / static_cast<double>(c.rows);
  std::vector<std::pair<double, int>> tail(scored.begin() + valid_from, scored.end());
  res.signal_auc_last_tenth = auc_of(tail);
  res.signal_auc = auc_of(scored);
  return res;
}

}  // namespace dlrec::io
