// Status and Result<T> are part of the public API (include/attnres/status.h).
#pragma once

#include "attnres/status.h"  // IWYU pragma: export
