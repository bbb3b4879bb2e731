// Includes the user's own headers and the SDK's; each must be what its includer meant.
#include "base/status.h"
#include "rendezvous/store/store.h"

#include <crun/worker/context.h>
#include <crun/worker/process_group.h>
#include <crun/worker/sampler.h>

#include <cstdio>

int main() {
  static_assert(USER_APP_STATUS_H == 1 && USER_APP_STORE_H == 1, "the user's headers");
  user_app::Status mine;
  user_app::Store store;
  const crun::Status ours = crun::InvalidArgument("crun's own Status");
  auto sampler = crun::worker::DistributedSampler::Create(8, 0, 2);
  std::printf("user %d %d, crun '%s', %zu samples\n", mine.code, store.keys, ours.message().c_str(),
              sampler.ok() ? sampler->size() : 0);
  return sampler.ok() && !ours.ok() ? 0 : 1;
}
