#pragma once
// Reading and checking torch-style option values, with messages that name the group and value.
#include <string>
#include <utility>

#include "graph/json.h"
#include "optfuse/optim.h"

namespace optfuse::optim {

// Option values in messages: message_text(v), never v.dump() (which throws on invalid UTF-8).
using graph_json::check_nesting;
using graph_json::message_text;

// The option as a finite double; Error "<where>: option 'lr' must be a finite number, got ...".
double number(const Options& h, const std::string& name, const std::string& where);
bool flag(const Options& h, const std::string& name, const std::string& where);
// A pair such as betas; Error unless a list of exactly two finite numbers.
std::pair<double, double> pair(const Options& h, const std::string& name, const std::string& where);

// Merges `overrides` into `base`, rejecting names that are not UTF-8 text (graph/names.h) or not
// in `base` (the rule's defaults) and values whose JSON kind differs from the default's ("lr"
// must be a number).
Options merge(const Options& base, const Options& overrides, const std::string& type,
              const std::string& where);

// Formats a double as Python would print it in torch's messages (e.g. -0.001, 1e-08, nan).
std::string pyfloat(double v);

}  // namespace optfuse::optim
