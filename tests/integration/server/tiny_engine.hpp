// Tiny converted models (tests/fixtures/make_tiny_model.py, f32 checkpoints) and engines on the built plugins, for
// the tests that run the engine in process.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "colibri/model/convert.hpp"

namespace colibri::test_support {

// WORK/name converted at `preset`, made once (private names, then renamed: parallel ctest processes never see half a
// model). `mxfp4`: the checkpoint's experts in MXFP4 (gpt-oss as OpenAI ships it). `patch` may change the checkpoint
// directory before it is converted.
inline std::filesystem::path tiny_model(const std::filesystem::path& work, const std::string& name,
                                        const std::string& arch, const std::string& preset, bool mxfp4 = false,
                                        const std::function<void(const std::filesystem::path&)>& patch = {}) {
  namespace fs = std::filesystem;
  const fs::path model = work / name;
  if (fs::exists(model / "manifest.json")) return model;
  fs::create_directories(work);
  const auto tag = name + "-" + std::to_string(::getpid());
  const fs::path ckpt = work / ("ckpt-" + tag);
  const std::string cmd = std::string(COLIBRI_TEST_PYTHON) + " '" + COLIBRI_TEST_SOURCE_DIR +
                          "/tests/fixtures/make_tiny_model.py' --arch " + arch + " --dtype f32" +
                          (mxfp4 ? " --mxfp4" : "") + " --out '" + ckpt.string() + "' >/dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
  if (patch) patch(ckpt);
  model::ConvertOptions co;
  co.input = ckpt;
  co.output = work / ("conv-" + tag);
  co.preset = preset;
  co.threads = 1;
  auto s = model::convert_model(co);
  EXPECT_TRUE(s) << (s ? "" : s.error().message());
  std::error_code ec;
  fs::rename(co.output, model, ec);
  if (ec) fs::remove_all(co.output);
  fs::remove_all(ckpt);
  return model;
}

}  // namespace colibri::test_support
