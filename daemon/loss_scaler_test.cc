#include "daemon/loss_scaler.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

LossScaleConfig Fp16(uint32_t window, uint32_t hysteresis) {
  LossScaleConfig c;
  c.enabled = true;
  c.initial_scale_power = 16;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.min_loss_scale = 1;
  return c;
}

TEST(LossScalerTest, HalvesOnOverflowOnceHysteresisIsUsedUp) {
  LossScaler s(Fp16(1000, 2));
  EXPECT_EQ(s.scale(), 65536.0);
  s.Update(true);  // uses one unit of hysteresis
  EXPECT_EQ(s.scale(), 65536.0);
  s.Update(true);
  EXPECT_EQ(s.scale(), 32768.0);
  s.Update(true);
  EXPECT_EQ(s.scale(), 16384.0);
}

TEST(LossScalerTest, DoublesAfterAWindowWithoutOverflow) {
  LossScaler s(Fp16(3, 1));
  s.Update(true);
  EXPECT_EQ(s.scale(), 32768.0);
  s.Update(false);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 32768.0);
  s.Update(false);  // a window of three clean steps before this one (DeepSpeed 0.19)
  EXPECT_EQ(s.scale(), 65536.0);
}

TEST(LossScalerTest, FirstDoublingWithoutOverflowAsDeepSpeed) {
  LossScaler s(Fp16(2, 2));
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  s.Update(false);  // iterations 0 and 1 were clean: DeepSpeed's stable_interval 2
  EXPECT_EQ(s.scale(), 131072.0);
}

TEST(LossScalerTest, NeverBelowTheMinimumAndStaticScalesStay) {
  LossScaleConfig c = Fp16(1000, 1);
  c.initial_scale_power = 1;
  c.min_loss_scale = 1;
  LossScaler s(c);
  for (int i = 0; i < 5; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 1.0);
  LossScaleConfig fixed = Fp16(1, 1);
  fixed.loss_scale = 128;
  LossScaler st(fixed);
  st.Update(true);
  st.Update(false);
  EXPECT_EQ(st.scale(), 128.0);
  EXPECT_TRUE(st.enabled());
  LossScaler off(LossScaleConfig{});
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.scale(), 1.0);
}

}  // namespace
}  // namespace strata
