// The JSON text under the native Kineto reader, read in place: whitespace, separators, strings
// (plain runs 16 bytes at a time with SSE2, escapes, strict UTF-8), numbers, literals, and the
// members and elements of objects and arrays. Header-only: it is the scan's hot loop, inlined
// into the readers built on it (events.cpp).

#pragma once

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

#include "columns.h"

namespace dtprof_kineto __attribute__((visibility("hidden"))) {

constexpr int kMaxDepth = 512;

// An optional JSON value of the kinds the importer reads. The readers below fill one in place:
// returned by value, each was built field by field on the stack and then copied with wide
// loads, which stall on narrow stores just made (store-to-load forwarding fails): in place, a
// scan is about 8% quicker.
struct Num {
  bool present = false;  // false: missing or null (the Python reader's None)
  bool odd = false;      // a value the Python reader would convert some other way
  bool integral = false;
  int64_t i = 0;    // integral and not odd: the value
  double d = 0.0;   // not integral: the value (integers are converted only where read as reals)
};

struct Str {
  bool present = false;
  std::string_view s;
};

// The text from begin_ to end_, read at p_: anything that is not valid JSON, or not of the
// kind read, throws Fallback (the file is given back).
class JsonReader {
 public:
  JsonReader(const char* text, int64_t len) : begin_(text), p_(text), end_(text + len) {}

 protected:
  const char* begin_;
  const char* p_;
  const char* end_;
  std::string key_scratch_;

  [[noreturn]] void fail(const char* why) const { throw Fallback{why, p_ - begin_}; }

  char peek() const { return p_ < end_ ? *p_ : '\0'; }

  // Whitespace passed: none (compact JSON), or the profiler's line breaks and indents 16 bytes
  // at a time (one compare per kind of space, instead of four a byte).
  void ws() {
    const char* q = p_;
    if (q < end_ && static_cast<unsigned char>(*q) > ' ') return;
#ifdef __SSE2__
    while (end_ - q >= 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
      const __m128i space = _mm_cmpeq_epi8(v, _mm_set1_epi8(' '));
      const __m128i line = _mm_cmpeq_epi8(v, _mm_set1_epi8('\n'));
      const __m128i ret = _mm_cmpeq_epi8(v, _mm_set1_epi8('\r'));
      const __m128i tab = _mm_cmpeq_epi8(v, _mm_set1_epi8('\t'));
      const __m128i blank = _mm_or_si128(_mm_or_si128(space, line), _mm_or_si128(ret, tab));
      const unsigned solid = ~static_cast<unsigned>(_mm_movemask_epi8(blank)) & 0xFFFFu;
      if (solid) {
        p_ = q + __builtin_ctz(solid);
        return;
      }
      q += 16;
    }
#endif
    while (q < end_ && (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t')) ++q;
    p_ = q;
  }

  // The usual separators, "c" or "c ", then a non-space: passed at once (false: not so).
  __attribute__((always_inline)) bool sep(char c) {
    if (end_ - p_ < 3 || p_[0] != c) return false;
    auto solid = [](char x) { return static_cast<unsigned char>(x) > ' '; };
    if (solid(p_[1])) {
      p_ += 1;
      return true;
    }
    if (p_[1] == ' ' && solid(p_[2])) {
      p_ += 2;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (p_ >= end_ || *p_ != c) fail("invalid JSON");
    ++p_;
  }

  // A string's content: a view into the text, or its unescaped copy in scratch. Valid UTF-8.
  std::string_view string(std::string& scratch) { return any_string<true>(scratch); }

  void skip_string() { any_string<false>(key_scratch_); }

  // Short plain strings (most keys and values) are read here, the rest by string_impl.
  template <bool kKeep>
  __attribute__((always_inline)) std::string_view any_string(std::string& scratch) {
#ifdef __SSE2__
    if (end_ - p_ > 16 && *p_ == '"') {
      int stop = plain_mask(p_ + 1);
      if (stop) {
        int n = __builtin_ctz(static_cast<unsigned>(stop));
        if (p_[1 + n] == '"') {
          const char* start = p_ + 1;
          p_ = start + n + 1;
          return std::string_view(start, static_cast<size_t>(n));
        }
      }
    }
#endif
    return string_impl<kKeep>(scratch);
  }

  template <bool kKeep>
  std::string_view string_impl(std::string& scratch) {
    expect('"');
    const char* start = p_;
    bool copied = false;  // escapes seen: the content is in scratch from then on
    while (true) {
      const char* run = p_;
      p_ = plain_ascii(p_, end_);
      if (kKeep && copied) scratch.append(run, p_ - run);
      if (p_ >= end_) fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        if (!kKeep) return std::string_view();
        return copied ? std::string_view(scratch) : std::string_view(start, p_ - 1 - start);
      }
      if (c < 0x20) fail("control character in a string");
      if (c >= 0x80) {
        const char* seq = p_;
        p_ += utf8_length(p_, end_);
        if (kKeep && copied) scratch.append(seq, p_ - seq);
        continue;
      }
      // a backslash
      if (kKeep && !copied) {
        scratch.assign(start, p_ - start);
        copied = true;
      }
      if (++p_ >= end_) fail("unterminated string");
      char e = *p_++;
      char out;
      switch (e) {
        case '"': out = '"'; break;
        case '\\': out = '\\'; break;
        case '/': out = '/'; break;
        case 'b': out = '\b'; break;
        case 'f': out = '\f'; break;
        case 'n': out = '\n'; break;
        case 'r': out = '\r'; break;
        case 't': out = '\t'; break;
        case 'u': {
          unsigned v = code_point();
          if (kKeep) utf8(scratch, v);
          continue;
        }
        default: fail("invalid escape in a string");
      }
      if (kKeep) scratch.push_back(out);
    }
  }

#ifdef __SSE2__
  // Of the 16 bytes at p, those a plain ASCII run stops at: '"', backslash, control or
  // non-ASCII (a bit each).
  static int plain_mask(const char* p) {
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // signed compare: bytes below 0x20 and those from 0x80 (negative) both stop
    __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                _mm_cmpgt_epi8(space, v));
    return _mm_movemask_epi8(stop);
  }
#endif

  // Past plain ASCII: the first '"', backslash, control or non-ASCII byte, or end.
  static const char* plain_ascii(const char* p, const char* end) {
#ifdef __SSE2__
    while (end - p >= 16) {
      int mask = plain_mask(p);
      if (mask) return p + __builtin_ctz(static_cast<unsigned>(mask));
      p += 16;
    }
#endif
    while (p < end) {
      unsigned char c = static_cast<unsigned char>(*p);
      if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) return p;
      ++p;
    }
    return p;
  }

  // The length of the strict UTF-8 sequence at p (no overlongs, surrogates or past U+10FFFF).
  size_t utf8_length(const char* p, const char* end) const {
    const unsigned char* u = reinterpret_cast<const unsigned char*>(p);
    unsigned char c = u[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      fail("invalid UTF-8");
    }
    if (static_cast<size_t>(end - p) < len) fail("invalid UTF-8");
    if (u[1] < lo || u[1] > hi) fail("invalid UTF-8");
    for (size_t k = 2; k < len; ++k)
      if (u[k] < 0x80 || u[k] > 0xBF) fail("invalid UTF-8");
    return len;
  }

  unsigned hex4() {
    if (end_ - p_ < 4) fail("unterminated string");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char h = *p_++;
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else fail("invalid \\u escape");
    }
    return v;
  }

  unsigned code_point() {
    unsigned v = hex4();
    if (v >= 0xDC00 && v <= 0xDFFF) fail("lone surrogate");
    if (v >= 0xD800 && v <= 0xDBFF) {
      if (end_ - p_ < 6 || p_[0] != '\\' || p_[1] != 'u') fail("lone surrogate");
      p_ += 2;
      unsigned low = hex4();
      if (low < 0xDC00 || low > 0xDFFF) fail("lone surrogate");
      v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
    }
    if (v == 0) fail("NUL in a string");
    return v;
  }

  static void utf8(std::string& out, unsigned v) {
    if (v < 0x80) {
      out.push_back(static_cast<char>(v));
    } else if (v < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (v >> 6)));
      out.push_back(static_cast<char>(0x80 | (v & 0x3F)));
    } else if (v < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (v >> 12)));
      out.push_back(static_cast<char>(0x80 | ((v >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (v & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (v >> 18)));
      out.push_back(static_cast<char>(0x80 | ((v >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((v >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (v & 0x3F)));
    }
  }

  // Whether the 8 bytes at q are all ASCII digits, and if so their value (in one go: the
  // usual SWAR reduction of digit pairs, then quads, then the eight).
  static bool eight_digits(const char* q, uint64_t& value) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t w;
    std::memcpy(&w, q, 8);
    constexpr uint64_t kHigh = 0xF0F0F0F0F0F0F0F0ull;
    if (((w & kHigh) | (((w + 0x0606060606060606ull) & kHigh) >> 4)) != 0x3333333333333333ull)
      return false;
    w -= 0x3030303030303030ull;
    w = (w * 10 + (w >> 8)) & 0x00FF00FF00FF00FFull;        // 4 pairs, first digit high
    w = (w * 100 + (w >> 16)) & 0x0000FFFF0000FFFFull;      // 2 quads
    value = (w * 10000 + (w >> 32)) & 0xFFFFFFFFull;         // the eight
    return true;
#else
    (void)q;
    (void)value;
    return false;
#endif
  }

  // A JSON number (its grammar checked), p_ past it: integers exactly while they fit int64.
  // The digits are read through a local pointer: a loop that advanced the member p_ would
  // store it back at every digit. kConvert false: a number skipped, its grammar checked only.
  template <bool kConvert = true>
  void number_value(Num& n) {
    n = Num();
    n.present = true;
    const char* const start = p_;
    const char* q = p_;
    const char* const end = end_;
    auto digit = [&] { return q < end && static_cast<unsigned char>(*q - '0') < 10; };
    bool negative = q < end && *q == '-';
    if (negative) ++q;
    uint64_t magnitude = 0;
    const char* digits = q;
    if (q < end && *q == '0') {
      ++q;
    } else if (!kConvert) {
      if (!digit()) {
        p_ = q;
        fail("invalid JSON");
      }
      while (digit()) ++q;
    } else if (digit()) {
      uint64_t eight;
      while (end - q >= 8 && eight_digits(q, eight)) {
        magnitude = magnitude * 100000000u + eight;  // wraps only past 19 digits (not fits)
        q += 8;
      }
      while (digit()) magnitude = magnitude * 10 + static_cast<unsigned>(*q++ - '0');
    } else {
      p_ = q;
      fail("invalid JSON");
    }
    bool fits = q - digits <= 19;  // 19 digits never wrap a uint64
    n.integral = true;
    if (q < end && *q == '.') {
      n.integral = false;
      ++q;
      if (!digit()) {
        p_ = q;
        fail("invalid number");
      }
      while (digit()) ++q;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
      n.integral = false;
      ++q;
      if (q < end && (*q == '+' || *q == '-')) ++q;
      if (!digit()) {
        p_ = q;
        fail("invalid number");
      }
      while (digit()) ++q;
    }
    p_ = q;
    if constexpr (!kConvert) return;
    constexpr uint64_t kMax = static_cast<uint64_t>(INT64_MAX);
    if (n.integral && fits && magnitude <= kMax + (negative ? 1 : 0)) {
      n.i = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
      return;
    }
    if (n.integral) n.odd = true;  // past int64: Python keeps it exact
    auto r = std::from_chars(start, p_, n.d);
    if (r.ec != std::errc() || r.ptr != p_ || !std::isfinite(n.d)) fail("number out of range");
  }

  // A value read as a number: numbers, null; anything else is odd (and skipped).
  void number(Num& n) {
    char c = peek();
    if (c == 'n') {
      literal("null");
      n = Num();
      return;
    }
    if (c != '-' && !(c >= '0' && c <= '9')) {
      n = Num();
      n.present = n.odd = true;
      skip(1);
      return;
    }
    number_value(n);
  }

  // A value read as a string: strings, null; anything else fails (the Python reader decides).
  void text(std::string& scratch, Str& s) {
    if (peek() == 'n') {
      literal("null");
      s = Str();
      return;
    }
    if (peek() != '"') fail("a string field holds something else");
    s.s = string(scratch);
    s.present = true;
  }


  template <size_t N>
  void literal(const char (&word)[N]) {
    constexpr size_t n = N - 1;
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, word, n) != 0) fail("invalid JSON");
    p_ += n;
  }

  // The comma-separated items between open and close: item() reads each one (p_ at it).
  template <typename Item>
  void items(char open, char close, Item&& item) {
    expect(open);
    ws();
    if (peek() == close) {
      ++p_;
      return;
    }
    while (true) {
      item();
      if (sep(',')) continue;
      ws();
      if (peek() == ',') {
        ++p_;
        ws();
        continue;
      }
      expect(close);
      return;
    }
  }

  // An object's members: member(key) reads each value (p_ at it). Keys share key_scratch_, so
  // a key is read before its value is.
  template <typename Member>
  void members(Member&& member) {
    items('{', '}', [&] {
      std::string_view key = string(key_scratch_);
      if (!sep(':')) {
        ws();
        expect(':');
        ws();
      }
      member(key);
    });
  }

  // An array's elements: element() reads each one (p_ at it).
  template <typename Element>
  void elements(Element&& element) {
    items('[', ']', element);
  }

  void skip(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    char c = peek();
    if (c == '"') {
      skip_string();
    } else if (c == '{') {
      members([&](std::string_view) { skip(depth + 1); });
    } else if (c == '[') {
      elements([&] { skip(depth + 1); });
    } else if (c == 't') {
      literal("true");
    } else if (c == 'f') {
      literal("false");
    } else if (c == 'n') {
      literal("null");
    } else {
      Num passed;
      number_value<false>(passed);
    }
  }
};

}  // namespace dtprof_kineto
