#include "optim/options.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "graph/names.h"
#include "optfuse/error.h"

namespace optfuse::optim {

std::string pyfloat(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Python's repr: the fewest significant digits that round-trip, positional notation for
  // exponents in [-4, 16) with at least one fractional digit ("1.0"), scientific otherwise.
  char buf[64];
  int digits = 1;
  for (; digits < 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*e", digits - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::snprintf(buf, sizeof buf, "%.*e", digits - 1, v);
  int exp10 = std::atoi(std::strchr(buf, 'e') + 1);
  if (exp10 >= -4 && exp10 < 16)
    std::snprintf(buf, sizeof buf, "%.*f", std::max(digits - 1 - exp10, 1), v);
  return buf;
}

static const Options& get(const Options& h, const std::string& name, const std::string& where) {
  auto it = h.find(name);
  if (it == h.end()) throw Error(where + ": missing option '" + name + "'");
  return *it;
}

double number(const Options& h, const std::string& name, const std::string& where) {
  const Options& v = get(h, name, where);
  if (!v.is_number())
    throw Error(where + ": option '" + name + "' must be a number, got " + message_text(v));
  double d = v.get<double>();
  if (!std::isfinite(d))
    throw Error(where + ": option '" + name + "' must be finite, got " + pyfloat(d));
  return d;
}

bool flag(const Options& h, const std::string& name, const std::string& where) {
  const Options& v = get(h, name, where);
  if (!v.is_boolean())
    throw Error(where + ": option '" + name + "' must be true or false, got " + message_text(v));
  return v.get<bool>();
}

std::pair<double, double> pair(const Options& h, const std::string& name,
                               const std::string& where) {
  const Options& v = get(h, name, where);
  if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number())
    throw Error(where + ": option '" + name + "' must be a list of two numbers, got " +
                message_text(v));
  std::pair<double, double> p{v[0].get<double>(), v[1].get<double>()};
  for (double d : {p.first, p.second})
    if (!std::isfinite(d))
      throw Error(where + ": option '" + name + "' must be finite, got " + pyfloat(d));
  return p;
}

static bool same_kind(const Options& a, const Options& b) {
  if (a.is_number() && b.is_number()) return true;
  if (a.is_null()) return b.is_null() || b.is_string();  // torch's None or a name (adjust_lr_fn)
  return a.type() == b.type();
}

Options merge(const Options& base, const Options& overrides, const std::string& type,
              const std::string& where) {
  check_nesting(overrides, where);  // before anything copies or shows it
  Options out = base;
  if (overrides.is_null()) return out;
  if (!overrides.is_object())
    throw Error(where + ": options must be a JSON object, got " + message_text(overrides));
  for (auto it = overrides.begin(); it != overrides.end(); ++it) {
    check_name(it.key(), where + ": option name");
    auto def = base.find(it.key());
    if (def == base.end()) {
      std::string known;
      for (auto k = base.begin(); k != base.end(); ++k)
        known += (known.empty() ? "" : ", ") + k.key();
      throw Error(where + ": unknown option '" + it.key() + "' for " + type + " (known: " + known +
                  ")");
    }
    if (!same_kind(*def, it.value()))
      throw Error(where + ": option '" + it.key() + "' must be like " + message_text(*def) +
                  ", got " + message_text(it.value()));
    out[it.key()] = it.value();
  }
  return out;
}

}  // namespace optfuse::optim
