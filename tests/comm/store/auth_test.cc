// Store authentication (docs/store.md, "Authentication"): a server started
// with a token answers a connection that does not present it first with
// one error and a close, having shown it no key; and the token's sources
// (files, the environment) are checked.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <set>
#include <sstream>

#include "comm/store/token.h"
#include "comm/store/wire.h"
#include "tests/comm/store/store_test_util.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::comm::store {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RawSocket;
using wire::MsgType;

const std::string kToken = "0123456789abcdef-the-jobs-token";
const std::string kWrong = "0123456789abcdef-someone-elses!";

std::string hello() {
  std::string out;
  wire::encode_hello(wire::Hello{}, out);
  return out;
}

class StoreAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreServerOptions o;
    o.host = "127.0.0.1";
    o.token = kToken;
    o.handshake_timeout = handshake_timeout_;
    server_ = StoreServer::start(o);
    owner_ = connect(kToken);
    owner_->set("secret", "value");
  }
  void TearDown() override {
    owner_.reset();
    server_.reset();
    // The token never reaches a log line.
    EXPECT_THAT(log_.text(), Not(HasSubstr(kToken)));
    EXPECT_THAT(log_.text(), Not(HasSubstr(kWrong)));
  }

  std::unique_ptr<TcpStore> connect(
      const std::string& token,
      std::chrono::milliseconds connect_timeout = 10s) {
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = server_->port();
    o.connect_timeout = connect_timeout;
    o.timeout = 10s;
    o.token = token;
    return TcpStore::connect(o);
  }

  // What a client presenting `token` (empty: none) gets for each request:
  // the error the server answers, and no value.
  void expect_refused_raw(const std::string& token) {
    for (const wire::Request& r :
         {wire::Request{
              .type = MsgType::kGet, .keys = {"secret"}, .timeout_ms = 1000},
          wire::Request{.type = MsgType::kSet,
          .keys = {"secret"},
          .values = {"overwritten"}},
          wire::Request{.type = MsgType::kNumKeys}}) {
      SCOPED_TRACE(wire::msg_type_name(r.type) + " with token '" + token + "'");
      testing::RawAnswer a = testing::raw_request(server_->port(), token, r);
      EXPECT_EQ(a.hello_flags, wire::kAuthRequired);
      EXPECT_EQ(a.type, MsgType::kError);
      EXPECT_THAT(a.message, HasSubstr(token.empty() ? "token is required"
                                                     : "wrong token"));
      EXPECT_THAT(a.bytes, Not(HasSubstr("value")));
      EXPECT_TRUE(a.closed);
    }
    EXPECT_EQ(owner_->get("secret"), "value");
    EXPECT_EQ(owner_->num_keys(), 1);
  }

  std::chrono::milliseconds handshake_timeout_ = 10s;
  testing::LogCapture log_;  // the server's log lines
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<TcpStore> owner_;
};

TEST_F(StoreAuthTest, TheJobsTokenReadsAndWrites) {
  auto c = connect(kToken);
  EXPECT_EQ(c->get("secret"), "value");
  c->set("k", "v");
  EXPECT_EQ(owner_->get("k"), "v");
  // clone() presents the same token.
  EXPECT_EQ(c->clone()->add("n", 2), 2);
}

TEST_F(StoreAuthTest, NoTokenCanNeitherReadNorWrite) {
  try {
    connect("");
    ADD_FAILURE() << "a client without the token connected";
  } catch (const StoreAuthError& e) {
    EXPECT_THAT(e.what(), HasSubstr("requires the job's token and this "
                                    "client has none"));
    EXPECT_THAT(e.what(), HasSubstr("DLAUNCH_RDZV_TOKEN"));
  }
  expect_refused_raw("");
  EXPECT_THAT(log_.text(), HasSubstr("the job's token is required before any "
                                     "request (the client sent get first)"));
}

TEST_F(StoreAuthTest, WrongTokenCanNeitherReadNorWrite) {
  auto start = std::chrono::steady_clock::now();
  try {
    connect(kWrong, 120s);
    ADD_FAILURE() << "a client with a wrong token connected";
  } catch (const StoreAuthError& e) {
    EXPECT_THAT(e.what(), HasSubstr("refused this client: wrong token"));
    EXPECT_THAT(e.what(), Not(HasSubstr(kWrong)));
  }
  // Refused at once, not retried until connect_timeout (120 s): a bound
  // that a loaded machine cannot miss.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
  expect_refused_raw(kWrong);
  expect_refused_raw(kToken.substr(0, kToken.size() - 1));
  expect_refused_raw(kToken + "x");
  EXPECT_THAT(log_.text(), HasSubstr("wrong token"));
}

TEST_F(StoreAuthTest, BeforeTheTokenOnlyASmallFrameIsRead) {
  // A frame header announcing 1 MiB before the token: closed from the
  // header alone.
  RawSocket s(server_->port());
  std::string header = {0, 0, 0x10, 0, static_cast<char>(MsgType::kSet)};
  s.send(hello() + header);
  EXPECT_TRUE(s.closed_by_peer());
  EXPECT_THAT(log_.text(), HasSubstr("exceeds the limit of 1029 bytes"));
}

class StoreAuthDeadlineTest : public StoreAuthTest {
 protected:
  StoreAuthDeadlineTest() { handshake_timeout_ = 300ms; }
};

TEST_F(StoreAuthDeadlineTest, NoTokenWithinTheHandshakeTimeoutIsClosed) {
  RawSocket s(server_->port());
  s.send(hello());
  EXPECT_EQ(s.recv_n(wire::kHelloBytes).size(), wire::kHelloBytes);
  EXPECT_TRUE(s.closed_by_peer());
  EXPECT_THAT(log_.text(), HasSubstr("no token within 300 ms"));
}

TEST(StoreAuthNoTokenTest, AServerWithoutATokenTakesClientsWithOrWithout) {
  auto server = testing::start_local_server();
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = server->port();
  o.token = kToken;
  auto with = TcpStore::connect(o);
  with->set("a", "1");
  EXPECT_EQ(testing::connect_to(server->port())->get("a"), "1");
}

TEST(TokenTest, ComparisonIsExact) {
  EXPECT_TRUE(token_matches(kToken, kToken));
  EXPECT_FALSE(token_matches(kToken, kWrong));
  EXPECT_FALSE(token_matches(kToken, ""));
  EXPECT_FALSE(token_matches(kToken, kToken + "0"));
  EXPECT_FALSE(token_matches(kToken, kToken.substr(1)));
  std::string last = kToken;
  last.back() ^= 1;
  EXPECT_FALSE(token_matches(kToken, last));
  EXPECT_TRUE(token_matches("", ""));
}

TEST(TokenTest, RandomTokensAreLongHexAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 16; ++i) {
    std::string t = random_token();
    EXPECT_EQ(t.size(), 64u);
    EXPECT_EQ(t.find_first_not_of("0123456789abcdef"), std::string::npos);
    EXPECT_EQ(check_token(t, "x"), t);
    seen.insert(t);
  }
  EXPECT_EQ(seen.size(), 16u);
}

std::string token_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const TokenError& e) {
    return e.what();
  }
  return "no error";
}

TEST(TokenTest, BadFormsAreRefusedWithoutShowingTheToken) {
  EXPECT_EQ(token_from_env(nullptr), std::nullopt);
  EXPECT_EQ(token_from_env(""), std::nullopt);
  EXPECT_EQ(token_from_env(kToken.c_str()), kToken);
  for (std::string bad :
       {std::string("short-secret"), std::string(1025, 'x'),
        std::string("0123456789abcdef 0123"), std::string("0123456789abcdef\n"),
        std::string("0123456789abcdef\x01")}) {
    std::string e = token_error([&] { token_from_env(bad.c_str()); });
    EXPECT_THAT(e, HasSubstr("the store token in DLAUNCH_RDZV_TOKEN"));
    EXPECT_THAT(e, HasSubstr("openssl rand -hex 32"));
    EXPECT_THAT(e, Not(HasSubstr(bad.substr(0, 12))));
  }
}

TEST(TokenTest, FilesMustBeOwnerOnly) {
  ::dlaunch::testing::TempDir dir;
  const auto file = dir / "token";
  ::dlaunch::testing::write_file(file, kToken + "\n", 0600);
  ::chmod(file.c_str(), 0600);
  EXPECT_EQ(read_token_file(file), kToken);
  ::chmod(file.c_str(), 0400);
  EXPECT_EQ(read_token_file(file), kToken);
  for (mode_t mode : {0640, 0604, 0644, 0620}) {
    ::chmod(file.c_str(), mode);
    std::string e = token_error([&] { read_token_file(file); });
    EXPECT_THAT(e, HasSubstr("token file " + file.string()));
    EXPECT_THAT(e, HasSubstr("group or others may read or change it"));
    EXPECT_THAT(e, HasSubstr("chmod 600 " + file.string()));
    EXPECT_THAT(e, Not(HasSubstr(kToken)));
  }
  EXPECT_THAT(token_error([&] { read_token_file(dir / "missing"); }),
              HasSubstr("cannot read token file " + (dir / "missing").string() +
                        ": no such file or directory"));
  EXPECT_THAT(token_error([&] { read_token_file(dir.path()); }),
              HasSubstr("is not a regular file"));
  ::dlaunch::testing::write_file(file, "tiny\n", 0600);
  ::chmod(file.c_str(), 0600);
  EXPECT_THAT(token_error([&] { read_token_file(file); }),
              HasSubstr("the store token in token file " + file.string() +
                        " has 4 characters"));
}

}  // namespace
}  // namespace dlaunch::comm::store
