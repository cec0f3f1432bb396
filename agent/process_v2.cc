// The one translation unit that compiles Boost.Process v2 (it is not
// header-only); BOOST_PROCESS_V2_SEPARATE_COMPILATION is set for the whole
// dlaunch_agent target in agent/CMakeLists.txt.
#include <boost/process/v2/src.hpp>
