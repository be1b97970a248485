// Command-line flags for the example programs: "--name value" pairs bound to config fields.
#pragma once

#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>

namespace kiln::examples {

class Flags {
 public:
  template <typename T>
  void add(const std::string& name, T* field) {
    setters_[name] = [field](const std::string& value) {
      std::istringstream in(value);
      T parsed{};
      in >> parsed;
      if (in.fail() || !in.eof()) return false;
      *field = parsed;
      return true;
    };
  }

  // A flag without a value ("--trace"): sets the field to true.
  void add_switch(const std::string& name, bool* field) { switches_[name] = field; }

  // Applies argv's flags. Returns the exit code when the program should stop: 0 after --help,
  // 2 after printing what was wrong and the usage.
  std::optional<int> parse(int argc, char** argv, const std::function<void()>& usage) const {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--help" || flag == "-h") {
        usage();
        return 0;
      }
      if (auto sw = switches_.find(flag); sw != switches_.end()) {
        *sw->second = true;
        continue;
      }
      auto it = setters_.find(flag);
      if (it == setters_.end() || i + 1 >= argc || !it->second(argv[i + 1])) {
        std::cerr << (it == setters_.end() ? "unknown flag " : "missing or bad value for ") << flag
                  << "\n";
        usage();
        return 2;
      }
      ++i;
    }
    return std::nullopt;
  }

 private:
  std::map<std::string, std::function<bool(const std::string&)>> setters_;
  std::map<std::string, bool*> switches_;
};

}  // namespace kiln::examples
