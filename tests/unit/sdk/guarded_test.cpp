// guarded() and create_guarded(): exceptions become Status values at the plugin boundary, naming the context.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>

#include "colibri/sdk/plugin.hpp"
#include "colibri/sdk/status.hpp"

namespace {

using namespace colibri::sdk;

TEST(Guarded, PassesResultsThrough) {
  EXPECT_TRUE(guarded("op", [] { return Status{}; }));
  const Status refused = guarded("op", [] { return Status(StatusCode::invalid_argument, "bad shape"); });
  EXPECT_EQ(refused.code(), StatusCode::invalid_argument);
  EXPECT_EQ(refused.message(), "bad shape");
  auto value = guarded("op", []() -> Expected<int> { return 7; });
  ASSERT_TRUE(value);
  EXPECT_EQ(*value, 7);
}

TEST(Guarded, TurnsExceptionsIntoInternalErrorsNamingTheContext) {
  const Status s = guarded("matmul", []() -> Status { throw std::runtime_error("device lost"); });
  EXPECT_EQ(s.code(), StatusCode::internal);
  EXPECT_EQ(s.message(), "matmul: device lost");
  auto e = guarded("allocate", []() -> Expected<int> { throw 42; });
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().code(), StatusCode::internal);
  EXPECT_EQ(e.error().message(), "allocate: unknown exception");
}

struct Thrower : PluginObject {
  static Expected<std::unique_ptr<Thrower>> create(const CreateContext& ctx) {
    if (ctx.host_info == nullptr) throw std::invalid_argument("no host info");
    return std::make_unique<Thrower>();
  }
};

TEST(CreateGuarded, BuildsTheObjectOrReportsWhatCreateThrew) {
  HostInfo info;
  CreateContext ok;
  ok.host_info = &info;
  auto made = create_guarded<Thrower>(ok);
  ASSERT_TRUE(made) << made.error().message();
  std::unique_ptr<PluginObject> owned(*made);
  EXPECT_NE(dynamic_cast<Thrower*>(owned.get()), nullptr);
  auto failed = create_guarded<Thrower>(CreateContext{});
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), StatusCode::internal);
  EXPECT_EQ(failed.error().message(), "create threw: no host info");
}

}  // namespace
