// Credentials, region and endpoint from the standard places, in the standard order.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "aws_config.hpp"

using namespace skyforge::aws;
namespace fs = std::filesystem;

namespace {

class AwsConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_ = fs::temp_directory_path() / ("skyforge-awscfg-" + std::to_string(::getpid()));
    fs::create_directories(home_ / ".aws");
    vars_["HOME"] = home_.string();
  }
  void TearDown() override { fs::remove_all(home_); }
  EnvLookup env() {
    return [this](const std::string& k) {
      auto it = vars_.find(k);
      return it == vars_.end() ? std::string() : it->second;
    };
  }
  void write(const std::string& rel, const std::string& text) { std::ofstream(home_ / rel) << text; }
  // Why resolve_aws refused; a test failure when it did not.
  std::string refusal(const std::string& profile, const std::string& region) {
    try {
      resolve_aws(env(), profile, region);
      ADD_FAILURE() << "resolve_aws(\"" << profile << "\", \"" << region << "\") did not refuse";
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  }

  fs::path home_;
  std::map<std::string, std::string> vars_;
};

TEST_F(AwsConfigTest, TheEnvironmentComesFirst) {
  write(".aws/credentials", "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = file-secret\n");
  vars_["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  vars_["AWS_SECRET_ACCESS_KEY"] = "env-secret";
  vars_["AWS_SESSION_TOKEN"] = "tok";
  vars_["AWS_REGION"] = "eu-central-1";
  ResolvedAws a = resolve_aws(env(), "", "");
  EXPECT_EQ(a.credentials.access_key_id, "AKIDENV");
  EXPECT_EQ(a.credentials.session_token, "tok");
  EXPECT_EQ(a.credentials.source, "the environment (AWS_ACCESS_KEY_ID)");
  EXPECT_EQ(a.region, "eu-central-1");
  EXPECT_EQ(a.endpoint, "https://ec2.eu-central-1.amazonaws.com");
}

TEST_F(AwsConfigTest, AProfileFromAwsProfileInTheCredentialsFileThenTheConfigFile) {
  write(".aws/credentials",
        "# comment\n[default]\naws_access_key_id = AKIDDEF\naws_secret_access_key = s1\n\n"
        "[dev]\naws_access_key_id = AKIDDEV\naws_secret_access_key = s2\n");
  write(".aws/config",
        "[default]\nregion = us-west-2\n[profile dev]\nregion = ap-south-1\n"
        "[profile cfgonly]\naws_access_key_id = AKIDCFG\naws_secret_access_key = s3\nregion = sa-east-1\n");
  vars_["AWS_PROFILE"] = "dev";
  ResolvedAws a = resolve_aws(env(), "", "");
  EXPECT_EQ(a.credentials.access_key_id, "AKIDDEV");
  EXPECT_EQ(a.region, "ap-south-1");
  EXPECT_EQ(a.credentials.source, "profile 'dev' in " + (home_ / ".aws/credentials").string());
  // The manifest's profile and region options win over the environment and the file.
  a = resolve_aws(env(), "cfgonly", "us-east-2");
  EXPECT_EQ(a.credentials.access_key_id, "AKIDCFG");
  EXPECT_EQ(a.region, "us-east-2");
  vars_.erase("AWS_PROFILE");
  a = resolve_aws(env(), "", "");
  EXPECT_EQ(a.credentials.access_key_id, "AKIDDEF");
  EXPECT_EQ(a.region, "us-west-2");
}

TEST_F(AwsConfigTest, TheEndpointFromTheServiceVariableThenTheGlobalOne) {
  vars_["AWS_ACCESS_KEY_ID"] = "AKID";
  vars_["AWS_SECRET_ACCESS_KEY"] = "s";
  vars_["AWS_DEFAULT_REGION"] = "us-east-1";
  vars_["AWS_ENDPOINT_URL"] = "http://127.0.0.1:1/";
  EXPECT_EQ(resolve_aws(env(), "", "").endpoint, "http://127.0.0.1:1");
  vars_["AWS_ENDPOINT_URL_EC2"] = "http://127.0.0.1:2";
  EXPECT_EQ(resolve_aws(env(), "", "").endpoint, "http://127.0.0.1:2");
  vars_["AWS_ENDPOINT_URL_EC2"] = "ftp://x";
  EXPECT_THROW(resolve_aws(env(), "", ""), std::runtime_error);
}

TEST_F(AwsConfigTest, NothingFoundNamesEveryPlaceLookedAt) {
  const std::string m = refusal("ghost", "us-east-1");
  EXPECT_NE(m.find("profile 'ghost'"), std::string::npos) << m;
  EXPECT_NE(m.find("AWS_ACCESS_KEY_ID"), std::string::npos) << m;
  EXPECT_NE(m.find((home_ / ".aws/credentials").string()), std::string::npos) << m;
  EXPECT_NE(m.find("[profile ghost]"), std::string::npos) << m;
  vars_["AWS_ACCESS_KEY_ID"] = "AKID";
  vars_["AWS_SECRET_ACCESS_KEY"] = "s";
  const std::string no_region = refusal("", "");
  EXPECT_NE(no_region.find("no region"), std::string::npos) << no_region;
}

TEST_F(AwsConfigTest, AMalformedFileIsNamedWithItsLine) {
  write(".aws/credentials", "[default]\naws_access_key_id = A\nthis line has no equals sign\n");
  const std::string m = refusal("", "us-east-1");
  EXPECT_NE(m.find((home_ / ".aws/credentials").string() + " line 3"), std::string::npos) << m;
}

TEST_F(AwsConfigTest, AKeyWithoutItsSecretIsRefusedWithoutPrintingTheKeyMaterial) {
  write(".aws/credentials", "[default]\naws_access_key_id = AKIDONLY\n");
  const std::string m = refusal("", "us-east-1");
  EXPECT_NE(m.find("no aws_secret_access_key"), std::string::npos) << m;
}

}  // namespace
