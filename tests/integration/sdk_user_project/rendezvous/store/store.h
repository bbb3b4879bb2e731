// The user's own rendezvous/store/store.h: nothing like crun's.
#pragma once

namespace user_app {
struct Store {
  int keys = 0;
};
}  // namespace user_app
#define USER_APP_STORE_H 1
