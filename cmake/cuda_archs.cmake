# Which GPUs the CUDA kernels are compiled for (docs/GPU.md "Other GPUs").
#
# FLASHSERVE_CUDA_ARCHS is a list of entries, each one of
#   90a          machine code for a compute capability with its arch-specific features (Hopper)
#   80, 89, 100  machine code for that compute capability (A100, Ada, Blackwell B200, ...)
#   80-virtual   PTX only: the driver compiles it for the GPU it meets, newer ones included
#   native       the compute capabilities of the GPUs nvidia-smi reports now (9.0 as 90a)
# AUTO is native where nvidia-smi answers, else 90a (H100/H200, the GPU the kernels are tuned on).
# The kernels need compute capability 8.0 (bf16 tensor-core mma, cp.async); overlapped launches
# (griddepcontrol) run from 9.0 and the one-instruction e4m3 conversion from 8.9, with exact
# fallbacks below.

# The compute capabilities nvidia-smi reports as entries ("9.0" -> 90a, "12.0" -> 120), or an
# empty list when it is missing or finds no GPU.
function(flashserve_native_cuda_archs out)
  set(archs "")
  find_program(FLASHSERVE_NVIDIA_SMI nvidia-smi)
  if(FLASHSERVE_NVIDIA_SMI)
    execute_process(COMMAND ${FLASHSERVE_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0)
      string(REPLACE "\n" ";" caps "${caps}")
      foreach(cap IN LISTS caps)
        string(STRIP "${cap}" cap)
        if(cap MATCHES "^([0-9]+)\\.([0-9])$")
          set(arch "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
          if(arch STREQUAL "90")
            set(arch "90a")
          endif()
          list(APPEND archs ${arch})
        endif()
      endforeach()
      list(REMOVE_DUPLICATES archs)
    endif()
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# nvcc's -gencode flags for a list of entries (AUTO and native resolved by the caller), in
# `out_flags`; `out_error` names the first entry that is not one of the forms above, or is older
# than 8.0, and is empty otherwise.
function(flashserve_cuda_gencode archs out_flags out_error)
  set(flags "")
  set(error "")
  if(archs STREQUAL "")
    set(error "FLASHSERVE_CUDA_ARCHS is empty")
  endif()
  foreach(entry IN LISTS archs)
    if(NOT entry MATCHES "^([0-9]+)(a|f)?(-virtual)?$")
      set(error "FLASHSERVE_CUDA_ARCHS entry '${entry}' is not of the form 90a, 100, 80-virtual or native")
      break()
    endif()
    set(number "${CMAKE_MATCH_1}")
    set(suffix "${CMAKE_MATCH_2}")
    set(virtual "${CMAKE_MATCH_3}")
    if(number LESS 80)
      set(error "FLASHSERVE_CUDA_ARCHS entry '${entry}': the kernels need compute capability 8.0 or later")
      break()
    endif()
    if(virtual)
      list(APPEND flags "-gencode=arch=compute_${number}${suffix},code=compute_${number}${suffix}")
    else()
      list(APPEND flags "-gencode=arch=compute_${number}${suffix},code=sm_${number}${suffix}")
    endif()
  endforeach()
  list(JOIN flags " " flags)
  set(${out_flags} "${flags}" PARENT_SCOPE)
  set(${out_error} "${error}" PARENT_SCOPE)
endfunction()

# Whether every entry is 9.0 or later (the kernel bench's bulk copies and mbarriers need it).
function(flashserve_cuda_archs_all_hopper archs out)
  set(all ON)
  foreach(entry IN LISTS archs)
    if(entry MATCHES "^([0-9]+)" AND CMAKE_MATCH_1 LESS 90)
      set(all OFF)
    endif()
  endforeach()
  set(${out} ${all} PARENT_SCOPE)
endfunction()
