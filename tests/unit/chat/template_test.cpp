// Chat templates render exactly as @huggingface/jinja does: golden files from tests/js/template_reference.mjs.
#include "colibri/chat/template.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "unit/tokenizer/test_paths.hpp"

namespace colibri::chat {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

fs::path chat_data() {
  return test::source_dir() / "tests/data/chat";
}

ojson case_by_name(const std::string& name) {
  const ojson all = ojson::parse(test::read_text(chat_data() / "conversations.json"));
  for (const auto& c : all["cases"]) {
    if (c["name"] == name) return c;
  }
  return nullptr;
}

std::vector<std::string> golden_templates() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(chat_data() / "golden")) {
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class GoldenTemplate : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTemplate, RendersLikeTheReference) {
  const ojson meta = ojson::parse(test::read_text(chat_data() / "golden" / (GetParam() + ".json")));
  auto tmpl = Template::parse(meta["source"].get<std::string>(), GetParam());
  ASSERT_TRUE(tmpl.has_value()) << tmpl.error().to_string();
  std::istringstream golden(test::read_text(chat_data() / "golden" / (GetParam() + ".jsonl")));
  int checked = 0;
  for (std::string line; std::getline(golden, line);) {
    if (line.empty()) continue;
    const ojson expected = ojson::parse(line);
    const ojson c = case_by_name(expected["case"].get<std::string>());
    ASSERT_FALSE(c.is_null()) << "unknown case " << expected["case"];
    RenderOptions options;
    options.add_generation_prompt = c.value("add_generation_prompt", false);
    options.bos_token = meta["bos"].get<std::string>();
    options.eos_token = meta["eos"].get<std::string>();
    if (c.contains("tools")) options.tools = c["tools"];
    if (c.contains("extra")) options.extra = c["extra"];
    auto out = tmpl->render(c["messages"], options);
    if (expected.contains("error")) {
      EXPECT_FALSE(out.has_value()) << "case " << expected["case"] << " should fail like the reference ("
                                    << expected["error"] << ") but rendered:\n"
                                    << (out ? *out : "");
    } else {
      ASSERT_TRUE(out.has_value()) << "case " << expected["case"] << ": " << out.error().to_string();
      EXPECT_EQ(*out, expected["output"].get<std::string>()) << "case " << expected["case"];
    }
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

INSTANTIATE_TEST_SUITE_P(All, GoldenTemplate, ::testing::ValuesIn(golden_templates()), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

TEST(BuiltinTemplates, MatchTheirTestDataCopies) {
  for (const std::string family : {"llama2", "mistral", "gpt-oss", "chatml"}) {
    auto builtin = builtin_template(family);
    ASSERT_TRUE(builtin.has_value()) << family;
    EXPECT_EQ(std::string(*builtin), test::read_text(chat_data() / "builtin" / (family + ".jinja"))) << family;
  }
  EXPECT_FALSE(builtin_template("no-such-family").has_value());
}

TEST(TemplateErrors, UnsupportedStatementNamesConstructAndLine) {
  auto t = Template::parse("Hello\n{% if x %}\n{% include 'other.j2' %}\n{% endif %}");
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().message().find("line 3"), std::string::npos) << t.error().message();
  EXPECT_NE(t.error().message().find("include"), std::string::npos) << t.error().message();
}

TEST(TemplateErrors, UnclosedBlocksAndBadSyntax) {
  for (const char* src : {"{% for m in messages %}x", "{{ 'abc }}", "{% if %}{% endif %}", "{{ a | }}", "{# never",
                          "{{ messages[ }}", "{% set %}", "{{ 1 +* 2 }}"}) {
    auto t = Template::parse(src);
    EXPECT_FALSE(t.has_value()) << src;
  }
}

TEST(TemplateErrors, UnsupportedFilterAtRenderTime) {
  auto t = Template::parse("{{ messages | wordcount }}");
  ASSERT_TRUE(t.has_value());
  auto out = t->render(ojson::array(), {});
  ASSERT_FALSE(out.has_value());
  EXPECT_NE(out.error().message().find("wordcount"), std::string::npos) << out.error().message();
}

TEST(TemplateErrors, RaiseExceptionCarriesTheMessage) {
  auto t = Template::parse("{{ raise_exception('roles must alternate') }}");
  ASSERT_TRUE(t.has_value());
  auto out = t->render(ojson::array(), {});
  ASSERT_FALSE(out.has_value());
  EXPECT_NE(out.error().message().find("roles must alternate"), std::string::npos);
}

TEST(TemplateErrors, MessagesMustBeAnArray) {
  auto t = Template::parse("x");
  ASSERT_TRUE(t.has_value());
  EXPECT_FALSE(t->render(ojson::object(), {}).has_value());
}

TEST(TemplateBasics, LoopControlScopingAndFilters) {
  auto t = Template::parse(
      "{%- set ns = namespace(n=0) -%}{%- for m in messages if m.role != 'skip' -%}{%- if loop.index > 3 %}{% break "
      "%}{% endif -%}{%- set ns.n = ns.n + 1 -%}[{{ loop.index0 }}:{{ m.content | upper }}]{%- else -%}none{%- endfor "
      "-%} n={{ ns.n }} {{ [3, 1, 2] | sort | join(',') }} {{ 'a,b' .split(',') | length }} {{ {'k': 1} | tojson }}");
  ASSERT_TRUE(t.has_value()) << t.error().to_string();
  ojson msgs = ojson::parse(R"([{"role":"a","content":"x"},{"role":"skip","content":"y"},{"role":"b","content":"z"}])");
  auto out = t->render(msgs, {});
  ASSERT_TRUE(out.has_value()) << out.error().to_string();
  EXPECT_EQ(*out, "[0:X][1:Z]n=2 1,2,3 2 {\"k\": 1}");  // -%} ate the space
}

TEST(ChatConfig, ShippedConfigsAndBuiltinFallback) {
  for (const std::string name : {"qwen3", "llama3", "mistral_nemo", "deepseek_v3", "gptoss", "mixtral", "llama2"}) {
    const auto dir = test::tokenizer_dir(name);
    if (!dir || !fs::exists(*dir / "tokenizer_config.json")) continue;
    auto config = load_chat_config(*dir / "tokenizer_config.json");
    ASSERT_TRUE(config.has_value()) << name << ": " << config.error().to_string();
    EXPECT_FALSE(config->template_source.empty()) << name;
    auto tmpl = Template::parse(config->template_source, name);
    ASSERT_TRUE(tmpl.has_value()) << name << ": " << tmpl.error().to_string();
    RenderOptions o;
    o.add_generation_prompt = true;
    o.bos_token = config->bos_token;
    o.eos_token = config->eos_token;
    auto out = tmpl->render(ojson::parse(R"([{"role":"user","content":"ping"}])"), o);
    ASSERT_TRUE(out.has_value()) << name << ": " << out.error().to_string();
    EXPECT_NE(out->find("ping"), std::string::npos) << name;
    if (name == "gptoss") {
      EXPECT_EQ(config->template_origin, "built-in gpt-oss");
    }
    if (name == "mixtral" || name == "llama2") {
      EXPECT_EQ(config->template_origin, "built-in llama2");
    }
  }
}

TEST(ChatConfig, BadFiles) {
  // Per process: another ctest run on the same machine (the asan and release builds) uses /tmp too.
  const auto tmp = fs::temp_directory_path() / ("colibri_chat_config_test_" + std::to_string(::getpid()) + ".json");
  { std::ofstream(tmp) << "{ not json"; }
  auto bad = load_chat_config(tmp);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find(tmp.string()), std::string::npos);
  { std::ofstream(tmp) << R"({"bos_token": "<x>"})"; }
  auto unknown = load_chat_config(tmp);
  ASSERT_FALSE(unknown.has_value());
  EXPECT_NE(unknown.error().message().find("no chat_template"), std::string::npos);
  auto named = load_chat_config(tmp, "mistral");
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->template_origin, "built-in mistral");
  fs::remove(tmp);
  EXPECT_FALSE(load_chat_config(tmp).has_value());
}

}  // namespace
}  // namespace colibri::chat
