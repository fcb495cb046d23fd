// A collective's args object, as the scan kept its text, read into CommArgs (read_comm_args):
// the keys the mapping of the collectives (kineto_collectives.cpp) reads, each the way
// kineto_map._add_args and _size read it, or odd.

#include <cstdint>
#include <string>
#include <string_view>

#include "kineto_json.h"
#include "kineto_scan.h"

namespace dtprof_kineto {
namespace {

class CommArgsReader : public JsonReader {
 public:
  using JsonReader::JsonReader;

  // A collective's args object (the text is one, checked by the scan): the last of a repeated
  // key counts, as in the Python reader.
  CommArgs comm_args() {
    CommArgs a;
    ws();
    members([&](std::string_view key) {
      if (is(key, "Collective name")) {
        a.name = text_value(a.name_s, a.odd, true);
      } else if (is(key, "dtype")) {
        a.dtype = text_value(a.dtype_s, a.odd, false);
      } else if (is(key, "Process Group Name")) {
        a.group = text_value(a.group_s, a.odd, true);
      } else if (is(key, "pg_name")) {
        a.pg_name = text_value(a.pg_name_s, a.odd, true);
      } else if (is(key, "In msg nelems")) {
        a.nelems = int_value(a.nelems_i, a.odd);
      } else if (is(key, "Seq") || is(key, "seq")) {
        const int k = key[0] == 'S' ? 0 : 1;
        a.seq[k] = int_value(a.seq_i[k], a.odd);
      } else if (is(key, "Input Dims")) {
        a.dims = true;
        a.dims_count = first_count(a.dims_count_i, a.odd);
      } else if (is(key, "Input type")) {
        a.types = true;
        a.first_type = first_string(a.first_type_s, a.odd);
      } else {
        skip(1);
      }
    });
    ws();
    if (p_ != end_) fail("args changed under the scan");
    return a;
  }

 private:
  // A value read as a string: kValue with the string, kNone for null; anything else kOther,
  // or odd where only a string is followed (str() of another kind is Python's own).
  CommArgs::State text_value(std::string& out, bool& odd, bool only_strings) {
    const char c = peek();
    if (c == 'n') {
      literal("null");
      return CommArgs::kNone;
    }
    if (c != '"') {
      skip(1);
      odd = odd || only_strings;
      return CommArgs::kOther;
    }
    std::string scratch;
    out.assign(string(scratch));
    return CommArgs::kValue;
  }

  // A value read as an integer: kValue for one that fits int64, kNone for null, kOther for
  // another kind; odd for a bool (Python counts it an int) or an integer past int64.
  CommArgs::State int_value(int64_t& out, bool& odd) {
    const char c = peek();
    if (c == 't' || c == 'f') {
      skip(1);
      odd = true;
      return CommArgs::kOther;
    }
    Num n;
    number(n);
    if (!n.present) return CommArgs::kNone;
    const bool number_read = c == '-' || (c >= '0' && c <= '9');
    if (number_read && n.integral && !n.odd) {
      out = n.i;
      return CommArgs::kValue;
    }
    if (number_read && n.integral) odd = true;  // past int64
    return CommArgs::kOther;
  }

  // "Input Dims": kValue where it is a list whose first element is a list, with the count of
  // that input's elements (their product where all are integers, else 0), else kOther; odd
  // for bools among them (Python counts them ints), negative ones or a count past 2^62.
  CommArgs::State first_count(int64_t& out, bool& odd) {
    if (peek() != '[') {
      skip(1);
      return CommArgs::kOther;
    }
    CommArgs::State state = CommArgs::kOther;
    bool first = true;
    elements([&] {
      if (!first || peek() != '[') {
        first = false;
        skip(2);
        return;
      }
      first = false;
      bool integers = true;
      int64_t count = 1;
      elements([&] {
        const char c = peek();
        if (c == 't' || c == 'f') {
          skip(3);
          odd = true;
          return;
        }
        Num n;
        number(n);
        const bool read = c == '-' || (c >= '0' && c <= '9');
        if (!(read && n.integral)) {  // null, a fraction, a string, a list: no count
          integers = false;
          return;
        }
        if (n.odd || n.i < 0 || (count && n.i > (int64_t{1} << 62) / count)) {
          odd = true;
          return;
        }
        count *= n.i;
      });
      out = integers ? count : 0;
      state = CommArgs::kValue;
    });
    return state;
  }

  // "Input type": its first element where it is a list (kValue: "" for an empty list), else
  // kOther; odd where that first element is no string.
  CommArgs::State first_string(std::string& out, bool& odd) {
    if (peek() != '[') {
      skip(1);
      return CommArgs::kOther;
    }
    bool first = true;
    out.clear();
    elements([&] {
      if (first && peek() == '"') {
        std::string scratch;
        out.assign(string(scratch));
      } else {
        if (first) odd = true;
        skip(2);
      }
      first = false;
    });
    return CommArgs::kValue;
  }
};

}  // namespace

CommArgs read_comm_args(std::string_view text) {
  return CommArgsReader(text.data(), static_cast<int64_t>(text.size())).comm_args();
}

}  // namespace dtprof_kineto
