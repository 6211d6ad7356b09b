#include "tools/validators.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "optfuse/cache.h"
#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/optim.h"

namespace optfuse::tools {
namespace {

// `text` as a whole double (no trailing characters, finite); false otherwise.
bool read_number(const std::string& text, double* value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  *value = std::strtod(text.c_str(), &end);
  return *end == '\0' && errno == 0 && std::isfinite(*value);
}

template <typename T>
std::string range_text(T min, T max) {
  std::ostringstream out;
  out << min << " to " << max;
  return out.str();
}

}  // namespace

CLI::Validator whole_number_in(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double number = 0;
        if (!read_number(text, &number)) return "'" + text + "' is not a number";
        char* end = nullptr;
        errno = 0;
        long long value = std::strtoll(text.c_str(), &end, 10);
        if (*end != '\0' || errno != 0) return "'" + text + "' is not a whole number";
        if (value < min || value > max)
          return text + " is not in the range " + range_text(min, max);
        return "";
      },
      range_text(min, max));
}

CLI::Validator number_in(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double value = 0;
        if (!read_number(text, &value)) return "'" + text + "' is not a number";
        if (value < min || value > max)
          return text + " is not in the range " + range_text(min, max);
        return "";
      },
      range_text(min, max));
}

CLI::Validator size_text() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          parse_size(text);
        } catch (const Error& e) {
          return e.what();
        }
        return "";
      },
      "SIZE");
}

CLI::Validator target_list() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::stringstream in(text);
        for (std::string target; std::getline(in, target, ',');) {
          if (target.empty()) continue;
          EngineOptions eo;  // resolves the target and nothing else: no cache, no schedules
          eo.target = target;
          eo.compile_only = true;
          eo.memory_only = true;
          eo.schedule_db = "none";
          try {
            Engine check(eo);
          } catch (const Error& e) {
            return e.what();
          }
        }
        return "";
      },
      "TARGET");
}

CLI::Validator optimizer_config() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::string type = text;
        if (!text.empty() && text[0] == '{') {
          Options config = Options::parse(text, nullptr, /*allow_exceptions=*/false);
          if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
            return "'" + text + "' is not a JSON object with a \"type\"";
          type = config["type"].get<std::string>();
        }
        std::string known;
        for (const std::string& t : optimizer_types()) {
          if (t == type) return "";
          known += (known.empty() ? "" : ", ") + t;
        }
        return "unknown optimizer '" + type + "' (" + known + ")";
      },
      "NAME|JSON");
}

}  // namespace optfuse::tools
