#pragma once
// The optfuse C++ API in one include. The plain C API is optfuse/optfuse.h.
#include "optfuse/cache.h"
#include "optfuse/dtype.h"
#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/graph.h"
#include "optfuse/idioms.h"
#include "optfuse/optim.h"
#include "optfuse/parallel.h"
#include "optfuse/partition.h"
#include "optfuse/schedules.h"
