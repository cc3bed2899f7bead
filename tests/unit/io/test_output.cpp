// The output policy (check_output_path) and the atomic writer (io/output.h): each case is one
// way an output used to destroy a file (`run --dump-logits` replaced the model's own
// model.safetensors, the prompt file, a read-only file and, as root, /dev/full).
#include "io/output.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace attnres {
namespace {

using namespace attnres::testing;

OutputCheck dump_check(std::vector<std::string> inputs, bool overwrite) {
  OutputCheck c;
  c.flag = "--dump-logits";
  c.overwrite = overwrite;
  c.inputs = std::move(inputs);
  return c;
}

// Refused with a message holding `expect`; the file's bytes unchanged.
void expect_refused(const std::string& path, const OutputCheck& c, const std::string& expect) {
  const std::string before = fs::is_regular_file(path) ? read_bytes(path) : "";
  auto r = check_output_path(path, c);
  ASSERT_FALSE(r.is_ok()) << path;
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(c.flag), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(expect), std::string::npos) << r.status().message();
  if (fs::is_regular_file(path)) {
    EXPECT_EQ(read_bytes(path), before);
  }
}

TEST(OutputPath, NewFileInAnExistingDirectory) {
  TempDir dir;
  auto r = check_output_path(dir.file("out.safetensors"), dump_check({}, false));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(*r, dir.file("out.safetensors"));
  expect_refused(dir.file("missing/out.safetensors"), dump_check({}, true),
                 "its directory '" + dir.file("missing") + "' does not exist");
  write_bytes(dir.file("plain"), "x");
  expect_refused(dir.file("plain/out.safetensors"), dump_check({}, true), "not a directory");
  expect_refused("", dump_check({}, true), "empty path");
}

TEST(OutputPath, ExistingFileOnlyWithOverwrite) {
  TempDir dir;
  write_bytes(dir.file("old"), "keep me");
  expect_refused(dir.file("old"), dump_check({}, false),
                 "already exists; pass --overwrite to replace it");
  auto r = check_output_path(dir.file("old"), dump_check({}, true));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  OutputCheck named = dump_check({}, false);
  named.overwrite_flag = "--force";
  expect_refused(dir.file("old"), named, "pass --force");
}

TEST(OutputPath, InputsAreNeverReplaced) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), "weights");
  write_bytes(dir.file("prompt.txt"), "1,2,3");
  const std::vector<std::string> inputs = {dir.file("config.json"), dir.file("model.safetensors"),
                                           dir.file("prompt.txt")};
  expect_refused(dir.file("model.safetensors"), dump_check(inputs, true), "is an input");
  expect_refused(dir.file("prompt.txt"), dump_check(inputs, true), "is an input");
  // The same file under another name: a hard link, a symbolic link, a relative spelling.
  fs::create_hard_link(dir.file("model.safetensors"), dir.file("hard"));
  expect_refused(dir.file("hard"), dump_check(inputs, true),
                 "the same file as the input '" + dir.file("model.safetensors") + "'");
  fs::create_symlink(dir.file("prompt.txt"), dir.file("link"));
  expect_refused(dir.file("link"), dump_check(inputs, true), "the same file as the input");
  expect_refused(dir.path() + "/./prompt.txt", dump_check(inputs, true), "the same file");
}

TEST(OutputPath, NonRegularFilesAreNeverReplaced) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0644), 0);
  expect_refused(dir.file("fifo"), dump_check({}, true), "is a FIFO");
  fs::create_directory(dir.file("sub"));
  expect_refused(dir.file("sub"), dump_check({}, true), "is a directory");
  expect_refused("/dev/null", dump_check({}, true), "is a character device");
  // Through a link: the target counts.
  fs::create_symlink("/dev/null", dir.file("null_link"));
  expect_refused(dir.file("null_link"), dump_check({}, true),
                 "is a character device ('/dev/null')");
  fs::create_symlink(dir.file("nowhere"), dir.file("dangling"));
  expect_refused(dir.file("dangling"), dump_check({}, true), "symbolic link to a missing file");
}

TEST(OutputPath, ReadOnlyFilesAreNeverReplaced) {
  TempDir dir;
  write_bytes(dir.file("ro"), "read-only");
  ASSERT_EQ(::chmod(dir.file("ro").c_str(), 0444), 0);
  // Even as root (rename() needs only the directory's permission) and with --overwrite.
  expect_refused(dir.file("ro"), dump_check({}, true), "is read-only");
}

TEST(OutputPath, SymlinksAreFollowedOrRefused) {
  TempDir dir;
  write_bytes(dir.file("target"), "old");
  fs::create_symlink(dir.file("target"), dir.file("link"));
  expect_refused(dir.file("link"), dump_check({}, false), "already exists ('" + dir.file("target"));
  auto r = check_output_path(dir.file("link"), dump_check({}, true));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(fs::path(*r), fs::canonical(dir.file("target")));
  OutputCheck no_follow = dump_check({}, true);
  no_follow.follow_symlinks = false;
  expect_refused(dir.file("link"), no_follow, "is a symbolic link; it is not replaced");
}

TEST(AtomicWriter, ReplacesOnlyWhenCompleteAndNeverANonRegularFile) {
  TempDir dir;
  write_bytes(dir.file("f"), "old");
  {
    AtomicFileWriter w;
    ASSERT_TRUE(w.open(dir.file("f")).is_ok());
    ASSERT_TRUE(w.write("new bytes", 9).is_ok());
    EXPECT_EQ(read_bytes(dir.file("f")), "old");  // not yet committed
  }  // destroyed without commit: the temporary file goes, the target stays
  EXPECT_EQ(read_bytes(dir.file("f")), "old");
  ASSERT_TRUE(write_file_atomic(dir.file("f"), "new").is_ok());
  EXPECT_EQ(read_bytes(dir.file("f")), "new");
  // A symbolic link at the path is not replaced by the writer itself either.
  fs::create_symlink(dir.file("f"), dir.file("l"));
  Status s = write_file_atomic(dir.file("l"), "via link");
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.message();
  EXPECT_TRUE(fs::is_symlink(dir.file("l")));
  ASSERT_EQ(::mkfifo(dir.file("p").c_str(), 0644), 0);
  EXPECT_FALSE(write_file_atomic(dir.file("p"), "x").is_ok());
  EXPECT_EQ(fs::status(dir.file("p")).type(), fs::file_type::fifo);
  // No temporary file is left behind by any of this.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
    ++entries;
  }
  EXPECT_EQ(entries, 3);
}

// A FIFO where a weight file should be used to block open() forever.
TEST(OutputPath, SafetensorsOpenRefusesAFifoWithoutBlocking) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("model.safetensors").c_str(), 0644), 0);
  auto f = SafetensorsFile::open(dir.file("model.safetensors"));
  ASSERT_FALSE(f.is_ok());
  EXPECT_NE(f.status().message().find("is a FIFO, expected a regular safetensors file"),
            std::string::npos)
      << f.status().message();
}

}  // namespace
}  // namespace attnres
