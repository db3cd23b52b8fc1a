#include "format/json_parse.h"

#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fs {
namespace {

// A SAX handler that builds the document on an explicit stack (no recursion) and checks the
// limits at every event. Objects of ordered_json are filled by appending to their underlying
// vector, with a hash index of the open object's keys for repeated keys, so that an object of n
// keys costs O(n) rather than ordered_map's O(n^2).
template <class J>
class BoundedBuilder {
 public:
  using number_integer_t = typename J::number_integer_t;
  using number_unsigned_t = typename J::number_unsigned_t;
  using number_float_t = typename J::number_float_t;
  using string_t = typename J::string_t;
  using binary_t = typename J::binary_t;
  static constexpr bool kOrdered = std::is_same_v<J, nlohmann::ordered_json>;

  explicit BoundedBuilder(const JsonLimits& limits) : limits_(limits) {}

  bool null() { return put(J(nullptr)) != nullptr; }
  bool boolean(bool v) { return put(J(v)) != nullptr; }
  bool number_integer(number_integer_t v) { return put(J(v)) != nullptr; }
  bool number_unsigned(number_unsigned_t v) { return put(J(v)) != nullptr; }
  bool number_float(number_float_t v, const string_t&) { return put(J(v)) != nullptr; }
  bool string(string_t& v) { return put(J(std::move(v))) != nullptr; }
  bool binary(binary_t& v) { return put(J::binary(std::move(v))) != nullptr; }

  bool start_object(std::size_t) { return open(J::value_t::object); }
  bool start_array(std::size_t) { return open(J::value_t::array); }
  bool key(string_t& k) {
    key_ = std::move(k);
    return true;
  }
  // A closed container gives back the spare capacity of its growth (up to half of it), so the
  // memory a document holds is proportional to its values, not to their growth history.
  bool end_object() {
    if constexpr (kOrdered) {
      static_cast<typename J::object_t::Container&>(
          stack_.back()->template get_ref<typename J::object_t&>())
          .shrink_to_fit();
      keys_.pop_back();
    }
    stack_.pop_back();
    return true;
  }
  bool end_array() {
    stack_.back()->template get_ref<typename J::array_t&>().shrink_to_fit();
    if constexpr (kOrdered) keys_.pop_back();
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    if (error_.empty())
      error_ = "not valid JSON at byte " + std::to_string(position) + ": " + e.what();
    return false;
  }

  J& root() { return root_; }
  const std::string& error() const { return error_; }

 private:
  bool fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  bool open(typename J::value_t type) {
    if (stack_.size() >= limits_.max_depth)
      return fail("JSON nested deeper than " + std::to_string(limits_.max_depth) + " levels");
    J* v = put(J(type));
    if (!v) return false;
    stack_.push_back(v);
    if constexpr (kOrdered) keys_.emplace_back();
    return true;
  }

  // Places `v` in the open container (or as the root); the pointer stays valid while `v` is open
  // because nothing is added to its parent until it closes.
  J* put(J&& v) {
    if (++values_ > limits_.max_values) {
      fail("JSON holds more than " + std::to_string(limits_.max_values) + " values");
      return nullptr;
    }
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    J& top = *stack_.back();
    if (top.is_array()) {
      auto& a = top.template get_ref<typename J::array_t&>();
      a.push_back(std::move(v));
      return &a.back();
    }
    auto& object = top.template get_ref<typename J::object_t&>();
    if constexpr (kOrdered) {
      auto& items = static_cast<typename J::object_t::Container&>(object);
      auto& index = keys_.back();
      const auto [it, inserted] = index.try_emplace(key_, items.size());
      if (!inserted) {
        items[it->second].second = std::move(v);
        return &items[it->second].second;
      }
      items.emplace_back(std::move(key_), std::move(v));
      return &items.back().second;
    } else {
      J& slot = object[std::move(key_)];
      slot = std::move(v);
      return &slot;
    }
  }

  const JsonLimits& limits_;
  J root_;
  std::vector<J*> stack_;
  // Per open container (empty for arrays): key -> position, for ordered objects only.
  std::vector<std::unordered_map<std::string, std::size_t>> keys_;
  string_t key_;
  std::size_t values_ = 0;
  std::string error_;
};

template <class J>
Expected<J> parse_bounded(std::string_view text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes)
    return invalid_argument("JSON text of " + std::to_string(text.size()) +
                            " bytes is longer than the limit of " +
                            std::to_string(limits.max_bytes));
  BoundedBuilder<J> builder(limits);
  bool ok = false;
  try {
    ok = J::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json,
                      /*strict=*/true);
  } catch (const std::exception& e) {
    return invalid_argument(std::string("not valid JSON: ") + e.what());
  }
  if (!ok) return invalid_argument(builder.error().empty() ? "not valid JSON" : builder.error());
  return std::move(builder.root());
}

}  // namespace

Expected<nlohmann::json> parse_json_bounded(std::string_view text, const JsonLimits& limits) {
  return parse_bounded<nlohmann::json>(text, limits);
}

Expected<nlohmann::ordered_json> parse_ordered_json_bounded(std::string_view text,
                                                            const JsonLimits& limits) {
  return parse_bounded<nlohmann::ordered_json>(text, limits);
}

}  // namespace fs
