# Reads cmake/layers.txt (the layer table) and gives a target the include roots
# of its module and of the modules that module may use, nothing more: a file
# that includes a header of a layer it may not use fails to compile (for headers
# under another root) or fails scripts/check_layers.py (for private headers under
# a shared root such as backends/).
file(STRINGS ${CMAKE_SOURCE_DIR}/cmake/layers.txt _dshim_layer_lines REGEX "^[a-z]")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/cmake/layers.txt)
foreach(_line ${_dshim_layer_lines})
  string(REGEX REPLACE "[ \t]+" ";" _cols "${_line}")
  list(GET _cols 0 _name)
  list(GET _cols 2 _root)
  list(GET _cols 4 _uses)
  set(DSHIM_LAYER_ROOT_${_name} ${CMAKE_SOURCE_DIR}/${_root})
  if(_uses STREQUAL "-")
    set(DSHIM_LAYER_USES_${_name} "")
  else()
    string(REPLACE "," ";" DSHIM_LAYER_USES_${_name} "${_uses}")
  endif()
  list(APPEND DSHIM_LAYERS ${_name})
endforeach()

# dshim_layer_includes(<target> <module>): PRIVATE include roots of <module> and its uses.
function(dshim_layer_includes target module)
  if(NOT DEFINED DSHIM_LAYER_ROOT_${module})
    message(FATAL_ERROR "dshim: no module '${module}' in cmake/layers.txt")
  endif()
  set(roots ${DSHIM_LAYER_ROOT_${module}})
  foreach(u ${DSHIM_LAYER_USES_${module}})
    list(APPEND roots ${DSHIM_LAYER_ROOT_${u}})
  endforeach()
  list(REMOVE_DUPLICATES roots)
  target_include_directories(${target} PRIVATE ${roots})
endfunction()

# Every include root: for the tests, which may look inside any layer.
set(DSHIM_ALL_LAYER_ROOTS "")
foreach(_name ${DSHIM_LAYERS})
  list(APPEND DSHIM_ALL_LAYER_ROOTS ${DSHIM_LAYER_ROOT_${_name}})
endforeach()
list(REMOVE_DUPLICATES DSHIM_ALL_LAYER_ROOTS)
