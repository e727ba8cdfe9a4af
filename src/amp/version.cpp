// lucid::amp::version(): compiled into the library, so that it reports the library a
// program runs with, whatever headers the program was compiled against.

#include <lucid/amp/version.h>

namespace lucid {
namespace amp {

const char* version() noexcept { return LUCID_AMP_VERSION_STRING; }

}  // namespace amp
}  // namespace lucid
