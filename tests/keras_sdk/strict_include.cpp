// Compiled with -Wconversion -Wsign-conversion -Wshadow -Wpedantic -Werror (see CMakeLists.txt).
#include <skyforge/datasets.hpp>
#include <skyforge/keras.hpp>
#include <skyforge/keras_callbacks.hpp>
#include <skyforge/tfevents.hpp>
