// The user's own base/status.h: nothing like crun's.
#pragma once

namespace user_app {
struct Status {
  int code = 0;
};
}  // namespace user_app
#define USER_APP_STATUS_H 1
