// The line-level API of the text reader: on_error values, the header's field mapping and
// parse_line (one line of a schema's format into a RawChunk row).
#include "dlrec/io/text_reader.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "dlrec/core/error.h"
#include "dlrec/core/config.h"
#include "text_line_parser.h"


namespace dlrec::io {

using namespace text_detail;

OnError parse_on_error(const std::string& s) {
  if (s == "fail") return OnError::Fail;
  if (s == "skip") return OnError::Skip;
  std::string near = nearest_name(s, {"fail", "skip"});
  fail("on_error must be 'fail' or 'skip', got '", s, "'",
       near.empty() ? "" : " (did you mean '" + near + "'?)");
}

std::vector<int> field_mapping(const Schema& schema, const std::string& header_line,
                               const std::string& file) {
  std::vector<int> map;
  if (!schema.header) {
    for (size_t i = 0; i < schema.columns.size(); ++i) map.push_back(static_cast<int>(i));
    return map;
  }
  const char* b = header_line.data();
  const char* e = b + header_line.size();
  if (e - b >= 3 && std::memcmp(b, "\xEF\xBB\xBF", 3) == 0) b += 3;  // UTF-8 byte order mark
  while (e > b && (e[-1] == '\r' || e[-1] == '\n')) --e;
  std::vector<Field> fields;
  LineError err;
  if (!split_fields(b, e, schema.delimiter, fields, err))
    fail(file, ":1: header column ", err.field + 1, ": ", err.msg);
  std::unordered_map<std::string, int> by_name;
  for (size_t i = 0; i < schema.columns.size(); ++i)
    by_name[schema.columns[i].name] = static_cast<int>(i);
  std::vector<int> seen(schema.columns.size(), -1);
  std::vector<std::string> header_names;
  std::string scratch;
  for (size_t i = 0; i < fields.size(); ++i) {
    Field f = fields[i].escaped ? unescape(fields[i], scratch) : fields[i];
    std::string name(f.b, f.e);
    // Surrounding blanks in a header name are not part of it.
    size_t s0 = name.find_first_not_of(" \t"), s1 = name.find_last_not_of(" \t");
    name = s0 == std::string::npos ? "" : name.substr(s0, s1 - s0 + 1);
    header_names.push_back(name);
    auto it = by_name.find(name);
    int col = it == by_name.end() ? -1 : it->second;
    if (col >= 0) {
      if (seen[col] >= 0)
        fail(file, ":1: column '", name, "' appears twice in the header (columns ", seen[col] + 1,
             " and ", i + 1, ")");
      seen[col] = static_cast<int>(i);
    }
    map.push_back(col);  // header columns the schema does not name are ignored
  }
  for (size_t c = 0; c < schema.columns.size(); ++c) {
    if (seen[c] >= 0 || schema.columns[c].kind == ColumnKind::Skip) continue;
    std::string near = nearest_name(schema.columns[c].name, header_names);
    fail(file, ":1: the header has no column '", schema.columns[c].name, "'",
         near.empty() ? "" : " (did you mean '" + near + "'?)");
  }
  return map;
}

void parse_line(const char* begin, const char* end, const Schema& schema,
                const std::vector<int>& field_to_column, RawChunk& out, const std::string& where) {
  const int nd = schema.num_dense(), nc = schema.num_cat();
  if (out.rows == 0 && (out.num_dense != nd || out.num_cat != nc ||
                        static_cast<int>(out.cat_offsets.size()) != nc))
    out.reset(nd, nc);
  DLREC_CHECK(out.num_dense == nd && out.num_cat == nc, where,
              ": parse_line: chunk column counts differ from the schema");
  while (end > begin && (end[-1] == '\n' || end[-1] == '\r')) --end;
  LineParser parser(schema, field_to_column);
  LineParser::Scratch scratch;
  LineError err;
  const bool ok = parser.parse(begin, end, out, scratch, err);
  parser.finish(out, scratch);
  if (!ok) fail(where, ": ", parser.field_prefix(err.field), err.msg);
}

}  // namespace dlrec::io
