// lucid::amp::version(): compiled into the library, so that it reports the library a
// program runs with, whatever headers the program was compiled against.

#include <lucid/amp/version.h>

#include "compat/torch_version.h"  // the supported LibTorch versions

namespace lucid {
namespace amp {

const char* version() noexcept { return LUCID_AMP_VERSION_STRING; }

}  // namespace amp
}  // namespace lucid
